package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// sunPathMax is the size of sockaddr_un's sun_path on Linux, the
// terminating NUL included: a unix socket's path must be shorter.
const sunPathMax = 108

// socketNameRoom is how long a socket's name (or a daemon's name for
// one) inside a SocketDir may be.
const socketNameRoom = 48

// SocketDir returns a new empty directory for unix sockets, removed when
// t ends: t.TempDir() when a path of socketNameRoom more bytes in it fits
// sun_path, else a directory under /tmp. A long TMPDIR (a build sandbox,
// a CI runner's work directory) leaves no room for a socket below
// t.TempDir(), whose own name adds the test's name and a number.
func SocketDir(t testing.TB) string {
	t.Helper()
	if d := t.TempDir(); len(d)+1+socketNameRoom < sunPathMax {
		return d
	}
	d, err := os.MkdirTemp("/tmp", "lockfs-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return filepath.Clean(d)
}
