package integration

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestSystemdNotify: run as a Type=notify service would be (NOTIFY_SOCKET
// set), the daemon sends READY=1 only once the mount answers, and
// STOPPING=1 when SIGTERM stops it. The socket is a unixgram socket of the
// test, standing in for systemd's; the daemon mounts for real.
func TestSystemdNotify(t *testing.T) {
	requireFUSE(t)
	base := t.TempDir()
	sock := filepath.Join(testutil.SocketDir(t), "notify.sock")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	msgs := make(chan string, 16)
	go func() {
		defer close(msgs)
		buf := make([]byte, 4096)
		for {
			n, _, err := ln.ReadFromUnix(buf)
			if err != nil {
				return
			}
			msgs <- string(buf[:n])
		}
	}()

	src, mnt := filepath.Join(base, "src"), filepath.Join(base, "mnt")
	for _, d := range []string{filepath.Join(src, "a"), mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m := startWrapped(t, []string{"env", "NOTIFY_SOCKET=" + sock}, src, mnt)
	next := func(what string) string {
		t.Helper()
		select {
		case msg, ok := <-msgs:
			if !ok {
				t.Fatalf("notify socket closed while waiting for %s", what)
			}
			return msg
		case <-m.exited:
			t.Fatalf("lockfs exited (%v) before sending %s; log:\n%s", m.state, what, m.logText())
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s within 30 s; log:\n%s", what, m.logText())
		}
		return ""
	}
	ready := next("READY=1")
	// At the moment of READY=1 the mount must already answer: that is what
	// units ordered After= it rely on.
	live, mounted := isLive(mnt), isMounted(mnt)
	if !strings.Contains(ready, "READY=1\n") && !strings.HasPrefix(ready, "READY=1") {
		t.Fatalf("first notification %q, want READY=1", ready)
	}
	if !live || !mounted {
		t.Fatalf("READY=1 sent before the mount answers (in /proc/mounts: %v, statfs: %v)", mounted, live)
	}
	if !strings.Contains(ready, "STATUS=serving "+src+" at "+mnt) {
		t.Errorf("READY=1 without the STATUS line: %q", ready)
	}
	if r := run(t, 10*time.Second, "flock", "-n", filepath.Join(mnt, "a/.lock"), "true"); r.code != 0 {
		t.Fatalf("flock after READY=1: %v", r)
	}

	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if stopping := next("STOPPING=1"); !strings.HasPrefix(stopping, "STOPPING=1") {
		t.Fatalf("notification after SIGTERM %q, want STOPPING=1", stopping)
	}
	if code, ok := m.waitExit(20 * time.Second); !ok || code != 0 {
		t.Fatalf("lockfs after SIGTERM: exited=%v code=%d", ok, code)
	}
}
