package testutil

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A socket can be made in SocketDir whatever TMPDIR is. Control: with
// this long a TMPDIR, a socket below t.TempDir() cannot be bound.
func TestSocketDirUnderLongTMPDIR(t *testing.T) {
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	if err := os.MkdirAll(long, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", long)
	t.Run("sub", func(t *testing.T) {
		if ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "x.sock")); err == nil {
			ln.Close()
			t.Fatal("control: a socket below t.TempDir() under a long TMPDIR was bound; the test shows nothing")
		}
		d := SocketDir(t)
		ln, err := net.Listen("unix", filepath.Join(d, strings.Repeat("s", socketNameRoom-5)+".sock"))
		if err != nil {
			t.Fatalf("socket in SocketDir %s: %v", d, err)
		}
		ln.Close()
	})
}
