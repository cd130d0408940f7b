// Package fstest holds what the mount tests of fs, fs/control and
// fs/filelock share: a lockfs mounted in process over a fresh SOURCE with
// a real engine over the local backend, and the real processes that drive
// it (flock(1), a Python helper that makes the exact calls a test needs
// and reports each errno). It imports nothing of fs, so that fs's own
// tests can use it: the caller makes and serves the file system (Start).
package fstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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

// Mount is a mounted lockfs for one test.
type Mount struct {
	T      *testing.T
	Src    string // SOURCE
	Dir    string // mount point
	Engine *lockmgr.Engine
}

// Start makes the file system of a mount over the engine, logging to log
// (fs.New), and returns how to serve a connection with it (fs.Serve, or a
// test's own server configuration) and how to close it once served.
type Start func(eng *lockmgr.Engine, log logrus.FieldLogger) (serve func(*fuse.Conn) error, closeFS func() error, err error)

// LogWriter sends log lines to the test log.
type LogWriter struct{ T testing.TB }

func (w LogWriter) Write(p []byte) (int, error) {
	w.T.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Logger returns a logger that writes to t's log, at info level, or debug
// with LOCKFS_TEST_DEBUG set.
func Logger(t testing.TB) *logrus.Logger {
	log := logrus.New()
	log.Out = LogWriter{t}
	log.Level = logrus.InfoLevel
	if os.Getenv("LOCKFS_TEST_DEBUG") != "" {
		log.Level = logrus.DebugLevel
	}
	return log
}

// Engine returns a lock engine over the local backend in src, as lockfs
// mount has, with the process tree of /proc. The caller closes it.
func Engine(t testing.TB, src string, log logrus.FieldLogger) *lockmgr.Engine {
	t.Helper()
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
	return eng
}

// ReaderGoroutine marks the stack of a bazil reader goroutine (the fork's
// fs/serve.go readLoop): each mount has a few, started and ended as
// requests come.
const ReaderGoroutine = "bazil.org/fuse/fs.(*Server).readLoop"

// goroutinesChecked holds the tests whose first mount has registered
// CheckGoroutines (CheckGoroutinesOnce); each test's entry is deleted when
// it ends. Test support only: fstest is imported by tests alone.
var goroutinesChecked sync.Map

// CheckGoroutinesOnce registers testutil.CheckGoroutines for t's first
// mount only: its check runs after every later mount's cleanup, whereas a
// later mount's would run while the first is still serving and count the
// first engine's goroutines (a process watch still finding heirs on a
// loaded machine) as its own leak.
func CheckGoroutinesOnce(t testing.TB) {
	if _, checked := goroutinesChecked.LoadOrStore(t, true); checked {
		return
	}
	t.Cleanup(func() { goroutinesChecked.Delete(t) })
	testutil.CheckGoroutines(t, ReaderGoroutine)
}

// MountAt mounts a lockfs over src, an existing SOURCE which several mounts
// (daemons) may share, with allow_other so that tests can run processes as
// nobody. Everything is undone in t.Cleanup: unmount (lazily if busy),
// engine closed, Serve returned, the file system closed.
func MountAt(t *testing.T, src string, start Start) *Mount {
	t.Helper()
	// Registered first, so that it checks after the unmount below.
	// bazil's readers are left out: another mount of the same test starts
	// and ends its own at any time, and this mount's end when its Serve
	// returns, which the cleanup waits for (ReaderGoroutine).
	CheckGoroutinesOnce(t)
	RequireFUSE(t, "flock")
	dir := t.TempDir()
	// Let the processes run as nobody reach both.
	for _, d := range []string{src, filepath.Dir(src)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	log := Logger(t)
	eng := Engine(t, src, log)
	serve, closeFS, err := start(eng, log)
	if err != nil {
		eng.Close()
		t.Fatal(err)
	}
	conn, err := fuse.Mount(dir, fuse.FSName("lockfs-test"), fuse.Subtype("lockfs"),
		fuse.LockingFlock(), fuse.LockingPOSIX(), fuse.DefaultPermissions(), fuse.AllowOther())
	if err != nil {
		eng.Close()
		t.Fatalf("mount: %v", err)
	}
	ServeUntilCleanup(t, dir, 1, conn, eng, serve, closeFS)
	PollProbe(t, src, dir)
	return &Mount{T: t, Src: src, Dir: dir, Engine: eng}
}

// ServeUntilCleanup serves conn with serve and registers in t.Cleanup what
// ends it: unmount mnt (tries times, 50 ms apart, then lazily), close the
// engine (lock waits still in flight end with it), wait for serve to
// return, close conn and then the file system (closeFS).
func ServeUntilCleanup(t testing.TB, mnt string, tries int, conn *fuse.Conn, eng *lockmgr.Engine, serve func(*fuse.Conn) error, closeFS func() error) {
	served := make(chan error, 1)
	go func() { served <- serve(conn) }()
	t.Cleanup(func() {
		var err error
		for i := 0; i < tries; i++ {
			if i > 0 {
				time.Sleep(50 * time.Millisecond)
			}
			if err = fuse.Unmount(mnt); err == nil {
				break
			}
		}
		if err != nil {
			t.Logf("unmount %s: %v; lazy unmount", mnt, err)
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
		if err := closeFS(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
}

// Mkdir creates directories in SOURCE, mode 0755.
func (m *Mount) Mkdir(rels ...string) {
	m.T.Helper()
	for _, rel := range rels {
		if err := os.MkdirAll(filepath.Join(m.Src, rel), 0o755); err != nil {
			m.T.Fatal(err)
		}
	}
}

// Path returns the path of rel in the mount.
func (m *Mount) Path(rel string) string { return filepath.Join(m.Dir, rel) }

// Status reads a control file as root.
func (m *Mount) Status(rel string) string {
	m.T.Helper()
	b, err := testutil.ReadNoPoll(m.Path(rel))
	if err != nil {
		m.T.Fatalf("read %s: %v", rel, err)
	}
	return string(b)
}

// RequireFUSE skips the test when FUSE, or one of the named tools, is
// unusable here, and fails it in CI, where it must work.
func RequireFUSE(t testing.TB, tools ...string) {
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

// PollProbe makes the kernel ask once to poll a regular file of the fresh
// mount, hear ENOSYS (fs's fileHandle.Poll) and never ask again on this
// mount.
//
// Without it, an in-process mount can deadlock: Go registers every file
// that os.Open opens with epoll, and the runtime makes that epoll_ctl call
// without leaving its P, so the goroutine waits in the kernel for the poll
// answer while holding a P; a garbage collection then waits forever for
// that P to stop, and the server goroutines that would answer are stopped.
// The probe uses open(2) and poll(2) through package unix, which do leave
// the P, so the server can answer it.
func PollProbe(t testing.TB, src, mnt string) {
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
