package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/admin"
	"github.com/lockfs/lockfs/internal/testutil"
)

// TestAdminSocketNames: mounts at DIR/a-b and DIR/a/b, whose admin sockets
// once had one name (the second mount failed), both come up and each
// answers lockfs status for itself; a daemon killed with SIGKILL leaves its
// socket, and the next daemon to start removes it.
func TestAdminSocketNames(t *testing.T) {
	requireFUSE(t)
	requireRoot(t)
	base := t.TempDir()
	adminDir := filepath.Join(testutil.SocketDir(t), "run")
	var mounts []*Mount
	for _, name := range []string{"a-b", "a/b"} {
		src, mnt := filepath.Join(base, "src", name), filepath.Join(base, "mnt", name)
		for _, d := range []string{filepath.Join(src, "d"), mnt} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		m := startMount(t, src, mnt, "--admin-dir", adminDir)
		m.waitReady()
		mounts = append(mounts, m)
	}
	for _, m := range mounts {
		r := run(t, 10*time.Second, lockfsBin, "status", "--admin-dir", adminDir, "--json", m.Mnt)
		if r.code != 0 || !strings.Contains(r.stdout, `"mountpoint": "`+m.Mnt+`"`) {
			t.Fatalf("status of %s: %v", m.Mnt, r)
		}
	}
	socks, _ := filepath.Glob(filepath.Join(adminDir, "*.sock"))
	if len(socks) != 2 {
		t.Fatalf("admin sockets %v, want two", socks)
	}

	// kill -9: the socket stays behind (the kernel does not remove it).
	victim := mounts[0]
	// Named as the daemon names it: from the real mountpoint, escaped, or
	// hashed when TMPDIR is long enough that the escaped name would not
	// fit a socket address.
	realMnt, err := filepath.EvalSymlinks(victim.Mnt)
	if err != nil {
		t.Fatal(err)
	}
	dead := admin.SocketPath(adminDir, realMnt)
	syscall.Kill(victim.Pid(), syscall.SIGKILL)
	if _, ok := victim.waitExit(10 * time.Second); !ok {
		t.Fatal("daemon not gone after SIGKILL")
	}
	if !slices.Contains(socks, dead) {
		t.Fatalf("the killed daemon's socket %s is not among %v", dead, socks)
	}
	if _, err := os.Lstat(dead); err != nil {
		t.Fatalf("the killed daemon's socket %q is already gone (%v): the check below would prove nothing", dead, err)
	}
	// Old enough to be judged dead rather than starting (admin.staleAge).
	old := time.Now().Add(-time.Minute)
	if err := os.Chtimes(dead, old, old); err != nil {
		t.Fatal(err)
	}
	src, mnt := filepath.Join(base, "src", "c"), filepath.Join(base, "mnt", "c")
	for _, d := range []string{src, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	startMount(t, src, mnt, "--admin-dir", adminDir).waitReady()
	if _, err := os.Lstat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead daemon's socket %s survived another daemon's start (%v)", dead, err)
	}
	// The live neighbour's socket is untouched.
	if r := run(t, 10*time.Second, lockfsBin, "status", "--admin-dir", adminDir, mounts[1].Mnt); r.code != 0 {
		t.Errorf("status of the live mount after the cleanup: %v", r)
	}
}
