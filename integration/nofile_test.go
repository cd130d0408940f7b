package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openMany opens path n times in one python3 process whose own descriptor
// limit is limit, and prints how many opens succeeded and the error that
// stopped them ("ok" if none).
const openMany = `import os, resource, sys
path, n, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
fds = []
err = "ok"
try:
    for _ in range(n):
        fds.append(os.open(path, os.O_RDONLY))
except OSError as e:
    err = os.strerror(e.errno)
print(len(fds), err)
`

// TestOpenFilesUpToTheProcessLimit (issue 31 item 17): a process whose own
// RLIMIT_NOFILE is 20,000 opens 6,000 files through a mount whose daemon
// started with the same limit, as on a local filesystem. Before, the
// daemon capped each user at a quarter of its own limit and the process got
// EMFILE at 5,000. The control: --max-open-per-uid 5000 stops it there,
// with EMFILE, so the count can tell.
func TestOpenFilesUpToTheProcessLimit(t *testing.T) {
	requireRoot(t)
	require(t, "python3")
	const limit, n = 20000, 6000
	// The daemon inherits this limit, as it would from a shell or a unit
	// with LimitNOFILE=20000 (Go's os/exec passes on a limit set with
	// Setrlimit). Restored once the daemons have started.
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		t.Fatal(err)
	}
	file := withSetup(func(src string) {
		if err := os.WriteFile(filepath.Join(src, "c", "f"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	m := mount(t, file)
	capped := mount(t, file, withArgs("--max-open-per-uid", "5000"))
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	r := run(t, 2*time.Minute, "python3", "-c", openMany, m.path("c/f"), strconv.Itoa(n), strconv.Itoa(limit))
	if strings.TrimSpace(r.stdout) != strconv.Itoa(n)+" ok" {
		t.Errorf("%d opens through the mount by a process allowed %d: %v\n(daemon: %s)", n, limit, r, settingsLine(m))
	}
	r = run(t, 2*time.Minute, "python3", "-c", openMany, capped.path("c/f"), strconv.Itoa(n), strconv.Itoa(limit))
	if strings.TrimSpace(r.stdout) != "5000 Too many open files" {
		t.Errorf("control, --max-open-per-uid 5000: %v, want EMFILE after 5000 opens", r)
	}
}

// settingsLine is the daemon's "settings in effect" log line.
func settingsLine(m *Mount) string {
	for _, l := range strings.Split(m.logText(), "\n") {
		if strings.Contains(l, "settings in effect") {
			return l
		}
	}
	return "(no settings line)"
}
