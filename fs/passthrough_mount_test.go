package fs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bazil.org/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// The passthrough tests mount lockfs in process over a fresh SOURCE, with a
// lock engine over the local backend as lockfs mount has, and drive the
// mount with ordinary system calls and real processes.

// ptMount is one mounted passthrough.
type ptMount struct {
	t   testing.TB
	fs  *FS
	src string // SOURCE
	mnt string // mount point
	// conn is the mount's connection.
	conn *fuse.Conn
	// msgs counts the log messages of the mount by text.
	msgs *msgCounter
}

// msgCounter is a logrus hook that counts messages by text.
type msgCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *msgCounter) Levels() []logrus.Level { return logrus.AllLevels }

func (c *msgCounter) Fire(e *logrus.Entry) error {
	c.mu.Lock()
	c.n[e.Message]++
	c.mu.Unlock()
	return nil
}

func (c *msgCounter) count(msg string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[msg]
}

// ptLogWriter sends log lines to the test log.
type ptLogWriter struct{ t testing.TB }

func (w ptLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// ptRequireFUSE skips the test when FUSE, or one of the named tools, is
// unusable here, and fails it in CI, where it must work.
func ptRequireFUSE(t testing.TB, tools ...string) {
	t.Helper()
	err := func() error {
		f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
		if err != nil {
			return err
		}
		f.Close()
		for _, tool := range append([]string{"fusermount3"}, tools...) {
			if _, err := exec.LookPath(tool); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		testutil.Missing(t, "FUSE is unavailable: %v", err)
	}
}

// newPTMount mounts a fresh SOURCE (mode 0755, reachable by nobody) with
// allow_other. t.Cleanup unmounts (lazily if busy) and waits for Serve.
func newPTMount(t testing.TB) *ptMount {
	t.Helper()
	src, mnt := t.TempDir(), t.TempDir()
	// Let processes run as nobody reach both.
	for _, d := range []string{src, filepath.Dir(src), filepath.Dir(mnt)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return newPTMountAt(t, src, mnt)
}

// ptTestPassthrough is whether newPTMountAt mounts with passthrough
// (Config.Passthrough), as lockfs mount does by default. On unless
// LOCKFS_TEST_PASSTHROUGH=off; TestPTDataLocksWithoutPassthrough turns it
// off while it runs the data-file lock tests again (fs tests are not
// parallel).
var ptTestPassthrough atomic.Bool

func init() { ptTestPassthrough.Store(os.Getenv("LOCKFS_TEST_PASSTHROUGH") != "off") }

// ptTestNoKillPriv, set by a test while it mounts, mounts without
// FUSE_HANDLE_KILLPRIV_V2 (mountOptions), as a control.
var ptTestNoKillPriv atomic.Bool

// withPassthrough sets Config.Passthrough for one mount.
func withPassthrough(on bool) func(*Config) { return func(c *Config) { c.Passthrough = on } }

// newPTMountAt mounts the existing directory src at the existing mnt, with
// a lock engine over the local backend (whose backing names the mount
// hides); opts adjust the configuration.
func newPTMountAt(t testing.TB, src, mnt string, opts ...func(*Config)) *ptMount {
	t.Helper()
	// Registered first, so that it checks after the unmount below.
	// bazil's readers are left out: another mount of the same test starts
	// and ends its own at any time, and this mount's end when its Serve
	// returns, which the cleanup waits for (readerGoroutine).
	checkGoroutinesOnce(t)
	ptRequireFUSE(t)
	log := logrus.New()
	log.Out = ptLogWriter{t}
	log.Level = logrus.InfoLevel
	if os.Getenv("LOCKFS_TEST_DEBUG") != "" {
		log.Level = logrus.DebugLevel
	}
	msgs := &msgCounter{n: map[string]int{}}
	log.AddHook(msgs)
	be, err := localbackend.New(localbackend.Config{Source: src, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := procinfo.NewTree(procinfo.TreeConfig{})
	if err != nil {
		be.Close()
		t.Fatal(err)
	}
	eng, err := lockmgr.New(lockmgr.Config{Backend: be, Processes: procs, Logger: log, Host: "testhost"})
	if err != nil {
		be.Close()
		t.Fatal(err)
	}
	cfg := Config{Source: src, Logger: log, Engine: eng, Passthrough: ptTestPassthrough.Load(), ReadDirPlus: true, SpliceReads: true}
	for _, o := range opts {
		o(&cfg)
	}
	f, err := New(cfg)
	if err != nil {
		eng.Close()
		t.Fatal(err)
	}
	mopts := mountOptions("lockfs-test", true, !ptTestNoKillPriv.Load())
	if cfg.Passthrough {
		mopts = append(mopts, PassthroughOption(src))
	}
	if cfg.ReadDirPlus {
		mopts = append(mopts, ReadDirPlusOption())
	}
	if cfg.SpliceReads {
		mopts = append(mopts, SpliceReadsOption())
	}
	conn, err := fuse.Mount(mnt, mopts...)
	if err != nil {
		f.Close()
		eng.Close()
		testutil.Missing(t, "mount: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- Serve(conn, f) }()
	t.Cleanup(func() {
		unmounted := false
		for i := 0; i < 20 && !unmounted; i++ {
			if err := fuse.Unmount(mnt); err == nil {
				unmounted = true
			} else {
				time.Sleep(50 * time.Millisecond)
			}
		}
		if !unmounted {
			if out, err := exec.Command("fusermount3", "-uz", mnt).CombinedOutput(); err != nil {
				t.Errorf("fusermount3 -uz %s: %v: %s", mnt, err, out)
			}
		}
		// Lock waits still in flight end when the engine closes.
		if err := eng.Close(); err != nil {
			t.Errorf("engine close: %v", err)
		}
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("Serve did not return after unmount")
		}
		conn.Close()
		if err := f.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	pollProbe(t, src, mnt)
	if on, why := f.PassthroughState(); cfg.Passthrough && !on && conn.Features()&fuse.InitPassthrough != 0 && os.Geteuid() == 0 {
		t.Fatalf("passthrough asked for, offered by the kernel, daemon root, yet off: %s", why)
	}
	return &ptMount{t: t, fs: f, src: src, mnt: mnt, conn: conn, msgs: msgs}
}

// pollProbe makes the kernel ask once to poll a regular file of the fresh
// mount, hear ENOSYS (fileHandle.Poll) and never ask again on this mount.
//
// Without it, an in-process mount can deadlock: Go registers every file
// that os.Open opens with epoll, and the runtime makes that epoll_ctl call
// without leaving its P, so the goroutine waits in the kernel for the poll
// answer while holding a P; a garbage collection then waits forever for
// that P to stop, and the server goroutines that would answer are stopped.
// The probe uses open(2) and poll(2) through package unix, which do leave
// the P, so the server can answer it.
func pollProbe(t testing.TB, src, mnt string) {
	t.Helper()
	const name = "lockfs-poll-probe"
	if err := os.WriteFile(src+"/"+name, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(src + "/" + name)
	fd, err := unix.Open(mnt+"/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("poll probe: open: %v", err)
	}
	defer unix.Close(fd)
	if _, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0); err != nil {
		t.Fatalf("poll probe: poll: %v", err)
	}
}

// m returns the path of rel on the mount.
func (m *ptMount) m(rel string) string { return m.mnt + "/" + rel }

// s returns the path of rel in SOURCE.
func (m *ptMount) s(rel string) string { return m.src + "/" + rel }
