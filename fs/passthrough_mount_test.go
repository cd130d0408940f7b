package fs

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"bazil.org/fuse"
	"github.com/sirupsen/logrus"

	fusefs "bazil.org/fuse/fs"

	"github.com/lockfs/lockfs/fs/internal/fstest"
	"github.com/lockfs/lockfs/internal/testutil"
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
	// returns, which the cleanup waits for (fstest.ReaderGoroutine).
	fstest.CheckGoroutinesOnce(t)
	fstest.RequireFUSE(t)
	log := fstest.Logger(t)
	msgs := &msgCounter{n: map[string]int{}}
	log.AddHook(msgs)
	eng := fstest.Engine(t, src, log)
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
	fstest.ServeUntilCleanup(t, mnt, 20, conn, eng, func(c *fuse.Conn) error { return Serve(c, f) }, f.Close)
	fstest.PollProbe(t, src, mnt)
	if on, why := f.PassthroughState(); cfg.Passthrough && !on && conn.Features()&fuse.InitPassthrough != 0 && os.Geteuid() == 0 {
		t.Fatalf("passthrough asked for, offered by the kernel, daemon root, yet off: %s", why)
	}
	return &ptMount{t: t, fs: f, src: src, mnt: mnt, conn: conn, msgs: msgs}
}

// m returns the path of rel on the mount.
func (m *ptMount) m(rel string) string { return m.mnt + "/" + rel }

// s returns the path of rel in SOURCE.
func (m *ptMount) s(rel string) string { return m.src + "/" + rel }

// ctlMount is a mounted lockfs (fstest.MountAt: the mount options of the
// control-file tests) with its file system.
type ctlMount struct {
	*fstest.Mount
	fs *FS
}

// newCtlMount mounts a fresh SOURCE, with allow_other so that tests can
// run processes as nobody. Everything is undone in t.Cleanup.
func newCtlMount(t *testing.T) *ctlMount {
	t.Helper()
	return newCtlMountAt(t, t.TempDir(), nil)
}

// newCtlMountConfig is newCtlMount with the bazil server configuration
// that config returns.
func newCtlMountConfig(t *testing.T, config func(*FS) *fusefs.Config) *ctlMount {
	t.Helper()
	return newCtlMountAt(t, t.TempDir(), config)
}

// newCtlMountAt is newCtlMountConfig over an existing SOURCE, which
// several mounts (daemons) may share; a nil config means ServerConfig.
func newCtlMountAt(t *testing.T, src string, config func(*FS) *fusefs.Config) *ctlMount {
	t.Helper()
	var fsys *FS
	m := fstest.MountAt(t, src, func(eng *lockmgr.Engine, log logrus.FieldLogger) (func(*fuse.Conn) error, func() error, error) {
		f, err := New(Config{Source: src, Engine: eng, Logger: log, Host: "testhost"})
		if err != nil {
			return nil, nil, err
		}
		fsys = f
		if config == nil {
			return func(c *fuse.Conn) error { return Serve(c, f) }, f.Close, nil
		}
		return func(c *fuse.Conn) error { return fusefs.New(c, config(f)).Serve(f) }, f.Close, nil
	})
	return &ctlMount{Mount: m, fs: fsys}
}
