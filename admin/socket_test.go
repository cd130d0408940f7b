package admin

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestSocketPathDistinct: mountpoints that the old "/" -> "-" mapping sent
// to one socket (/x/a-b and /x/a/b) get distinct ones, and names are those
// of systemd-escape --path (checked against the real tool when present).
func TestSocketPathDistinct(t *testing.T) {
	paths := []string{"/", "/srv/locked", "/x/a-b", "/x/a/b", "/x/a\\x2db", "/x/.hidden dir", "/x/ünï"}
	seen := map[string]string{}
	for _, p := range paths {
		s := SocketPath("/run/lockfs", p)
		if other, dup := seen[s]; dup {
			t.Errorf("%q and %q share the socket %s", p, other, s)
		}
		seen[s] = p
		if out, err := exec.Command("systemd-escape", "--path", p).Output(); err == nil {
			if want := strings.TrimSpace(string(out)); filepath.Base(s) != want+".sock" {
				t.Errorf("SocketPath(%q) = %s, systemd-escape says %s", p, s, want)
			}
		}
	}
	if got := SocketPath("/run/lockfs", "/x/a-b"); got != `/run/lockfs/x-a\x2db.sock` {
		t.Errorf("SocketPath(/x/a-b) = %s", got)
	}
}

// TestSocketPathLong: a mountpoint too long for a socket address gets a
// name that fits, distinct from its neighbour's with the same prefix.
func TestSocketPathLong(t *testing.T) {
	long := "/" + strings.Repeat("d", 200)
	a, b := SocketPath("/run/lockfs", long+"/a"), SocketPath("/run/lockfs", long+"/b")
	if len(a) > maxSocketPath || len(b) > maxSocketPath {
		t.Fatalf("too long for sun_path: %d, %d", len(a), len(b))
	}
	if a == b {
		t.Fatalf("two long mountpoints share %s", a)
	}
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), filepath.Base(a)))
	if err != nil {
		t.Skipf("temp dir too deep for a test socket: %v", err)
	}
	ln.Close()
}

// deadSocket leaves a socket file that nobody listens on, as a daemon
// killed with SIGKILL does.
func deadSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}

// TestRemoveStale: a dead daemon's socket is removed; a live one, a dead one
// too young to judge (a daemon between bind and listen) and a file that is
// not a socket are left alone. The control is the live socket, which the
// same code must not touch.
func TestRemoveStale(t *testing.T) {
	dir := testutil.SocketDir(t)
	old := time.Now().Add(-time.Minute)
	dead := filepath.Join(dir, "dead.sock")
	deadSocket(t, dead)
	young := filepath.Join(dir, "young.sock")
	deadSocket(t, young)
	live := filepath.Join(dir, "live.sock")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	plain := filepath.Join(dir, "plain.sock")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dead, live, plain} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	RemoveStale(dir, nil)
	if _, err := os.Lstat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead daemon's socket is still there (%v)", err)
	}
	for _, p := range []string{young, live, plain} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(p), err)
		}
	}
	if c, err := net.Dial("unix", live); err != nil {
		t.Errorf("the live socket no longer answers: %v", err)
	} else {
		c.Close()
	}
}
