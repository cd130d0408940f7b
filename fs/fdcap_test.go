package fs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"

	"github.com/lockfs/lockfs/fs/internal/fstest"
)

// openUntilFull opens path read-only until an error, as uid, and reports
// how many it got and the errno; it keeps them open until its stdin closes.
const openUntilFull = `
import os, sys, resource, errno
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 100000), hard))
fds, err = [], 'none'
while len(fds) < 20000:
    try:
        fds.append(os.open(sys.argv[1], os.O_RDONLY))
    except OSError as e:
        err = errno.errorcode[e.errno]
        break
print(len(fds), err, flush=True)
sys.stdin.read()
`

// hog runs openUntilFull as uid and returns what it printed; it holds its
// descriptors until the test ends.
func hog(t *testing.T, uid uint32, path string) string {
	t.Helper()
	cmd := exec.Command(fstest.Python(t), "-c", openUntilFull, path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	return strings.TrimSpace(testutil.StartChild(t, cmd).Line(time.Minute))
}

// lowNofile lowers this process's soft descriptor limit (the in-process
// daemon's) to n for the rest of the test, so that one user can fill it.
func lowNofile(t *testing.T, n uint64) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &old) })
}

// otherUser starts a shell as uid that, once told to (go), runs lookups,
// getattr, readdir, readlink and an open through the mount and returns its
// exit code and output. It is started before the hog fills the daemon's
// table, which is this process's: starting it later would need
// descriptors here.
func otherUser(t *testing.T, m *ptMount, uid uint32) (goRun func() (int, string)) {
	t.Helper()
	cmd := exec.Command("sh", "-c", fmt.Sprintf("read x; stat %[1]s/g > /dev/null && ls %[1]s/d > /dev/null && readlink %[1]s/l > /dev/null && cat %[1]s/g", m.mnt))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return func() (int, string) {
		in.Write([]byte("go\n"))
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), out.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, out.String()
	}
}

// fdcapScenario mounts a fresh SOURCE with the per-uid cap max (0: none),
// lowers the daemon's descriptor limit to 256, lets uid 65534 open files
// until an error (the hog), and then has uid 65533 use the mount. It
// returns what the hog got and how the other user fared. The mount has no
// passthrough, so that every open holds a descriptor of the daemon (with
// passthrough they hold none: detach_test.go).
func fdcapScenario(t *testing.T, max int) (hogGot string, code int, out string) {
	t.Helper()
	testutil.RequireRoot(t, "to run processes as two other users")
	testutil.RequireTools(t, "python3")
	src, mnt := t.TempDir(), t.TempDir()
	for _, d := range []string{src, mnt, filepath.Dir(src)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m := newPTMountAt(t, src, mnt, withPassthrough(false), func(c *Config) { c.MaxOpenPerUID = max })
	for _, f := range []string{"f", "g"} {
		if err := os.WriteFile(m.s(f), []byte("data\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(m.s("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("g", m.s("l")); err != nil {
		t.Fatal(err)
	}
	other := otherUser(t, m, 65533)
	lowNofile(t, 256)
	hogGot = hog(t, 65534, m.m("f"))
	code, out = other()
	return hogGot, code, out
}

// TestOpenCapPerUser: a user who opens files through the mount until
// EMFILE gets it at their cap, and another user's lookups, stats, readdir,
// readlink and opens still work. Before the fix (no cap; the control
// below), the first user filled the daemon's descriptor table and the
// second user's calls failed with EMFILE too.
func TestOpenCapPerUser(t *testing.T) {
	got, code, out := fdcapScenario(t, 50)
	if got != "50 EMFILE" {
		t.Errorf("the hog got %q, want 50 EMFILE (its cap)", got)
	}
	if code != 0 || out != "data\n" {
		t.Errorf("another user while the hog is at its cap: exit %d: %s", code, out)
	}
}

func TestOpenCapPerUserControl(t *testing.T) {
	got, code, out := fdcapScenario(t, 0)
	if !strings.HasSuffix(got, " EMFILE") {
		t.Fatalf("the hog got %q, want EMFILE from the daemon's full table", got)
	}
	if code == 0 || !strings.Contains(out, "Too many open files") {
		t.Errorf("without a cap, another user was served although the hog filled the daemon's table (exit %d: %s)", code, out)
	}
}

// TestOpenCapCountsLockCarriers: the descriptor that carries a process's
// byte-range locks on a file counts towards its user's cap as a handle
// does; at the cap a new carrier is refused with ENOLCK and released
// carriers give their place back. Control: the same opens without the lock
// stay within the cap. Without passthrough, where each open holds a
// descriptor (detach_test.go has the same with passthrough).
func TestOpenCapCountsLockCarriers(t *testing.T) {
	m := newPTMountAt(t, t.TempDir(), t.TempDir(), withPassthrough(false), func(c *Config) { c.MaxOpenPerUID = 2 })
	for _, f := range []string{"f", "g"} {
		if err := os.WriteFile(m.s(f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := fstest.StartPy(t, 0, 0)
	p.Must("ok", "open f %s", m.m("f"))
	p.Must("ok", "open g %s", m.m("g")) // control: two handles, at the cap
	p.Must("err ENOLCK", "lockf f ex nb")
	p.Must("ok", "close g")
	testutil.Eventually(t, "the release of g", func() bool { return m.fs.handles.count(0) == 1 })
	p.Must("ok", "lockf f ex nb") // the carrier takes g's place
	p.Must("err EMFILE", "open g %s", m.m("g"))
	p.Must("ok", "close f") // a POSIX lock ends at any close: the carrier goes
	testutil.Eventually(t, "the release of f and its carrier", func() bool { return m.fs.handles.count(0) == 0 })
	p.Must("ok", "open g %s", m.m("g"))
}
