package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"
)

// openToLimit opens the files named in its arguments in turn, read-only,
// in one python3 process whose own descriptor limit (soft and hard) is
// limit, until an error; it prints how many opens succeeded, the error that
// stopped them ("ok" if none) and how many descriptors it held before
// (its own), and keeps them open until its stdin closes.
const openToLimit = `import os, resource, sys
limit, paths = int(sys.argv[1]), sys.argv[2:]
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
own = len(os.listdir('/proc/self/fd')) - 1
fds = []
err = "ok"
try:
    while len(fds) < limit:
        fds.append(os.open(paths[len(fds) % len(paths)], os.O_RDONLY))
except OSError as e:
    err = os.strerror(e.errno)
print(len(fds), err.replace(" ", "_"), own, flush=True)
sys.stdin.read()
`

// TestOpenFilesUpToTheProcessLimit (issue 31 item 17): a process whose own
// RLIMIT_NOFILE is 20,000 opens files through a mount whose daemon started
// with the same limit until EMFILE, and gets it at its own limit (less the
// descriptors it held already), as on a local filesystem, while the daemon
// holds hardly more descriptors than before: with FUSE passthrough an
// open costs the daemon none (fs/detach.go). Control: with
// --passthrough=off every open holds a descriptor of the daemon, and the
// per-uid cap (seven eighths of the daemon's limit) refuses first. Before,
// that was so with passthrough too.
func TestOpenFilesUpToTheProcessLimit(t *testing.T) {
	requireRoot(t)
	require(t, "python3")
	const limit, nfiles = 20000, 500
	// The daemons inherit this limit, as from a shell or a unit with
	// LimitNOFILE=20000 (Go's os/exec passes on a limit set with
	// Setrlimit). Restored once the daemons have started.
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		t.Fatal(err)
	}
	files := withSetup(func(src string) {
		for i := range nfiles {
			if err := os.WriteFile(filepath.Join(src, "c", fmt.Sprintf("f%d", i)), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})
	m := mount(t, files)
	off := mount(t, files, withArgs("--passthrough=off"))
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	if !testutil.Poll(10*time.Second, func() bool { return strings.Contains(m.logText(), "cost the daemon no descriptor") }) {
		testutil.Missing(t, "FUSE passthrough with file handles is off on this host: %s", m.logText())
	}
	// openAll runs openToLimit on mount mm's files and returns what it
	// printed and how many more descriptors mm's daemon held while the
	// process held its opens than before.
	openAll := func(mm *Mount) (got string, own, daemonMore int) {
		t.Helper()
		before := countFds(t, mm)
		args := []string{strconv.Itoa(limit)}
		for i := range nfiles {
			args = append(args, mm.path("c", fmt.Sprintf("f%d", i)))
		}
		p := startPython(t, openToLimit, args...)
		defer p.kill()
		var line string
		select {
		case line = <-p.lines:
		case <-time.After(5 * time.Minute):
			t.Fatalf("the opener printed nothing in 5 min; stderr %q", p.stderr.String())
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("the opener printed %q; stderr %q", line, p.stderr.String())
		}
		own, _ = strconv.Atoi(f[2])
		return f[0] + " " + f[1], own, countFds(t, mm) - before
	}

	got, own, more := openAll(m)
	if want := fmt.Sprintf("%d Too_many_open_files", limit-own); got != want {
		t.Errorf("a process allowed %d descriptors (%d its own) got %q through the mount, want %q\n(daemon: %s)", limit, own, got, want, settingsLine(m))
	}
	if more > 50 {
		t.Errorf("the daemon held %d more descriptors while the process held its opens, want a few at most", more)
	}
	t.Logf("passthrough: %s (own %d); daemon descriptors %+d", got, own, more)

	got, _, more = openAll(off)
	if want := fmt.Sprintf("%d Too_many_open_files", limit*7/8); got != want {
		t.Errorf("control, --passthrough=off: %q, want %q (the per-uid cap: every open holds a descriptor of the daemon)", got, want)
	}
	if more < limit*7/8 {
		t.Errorf("control, --passthrough=off: the daemon held %d more descriptors, want one per open", more)
	}
	t.Logf("--passthrough=off: %s; daemon descriptors %+d", got, more)
}

// countFds counts the descriptors m's daemon holds.
func countFds(t *testing.T, m *Mount) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", m.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
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
