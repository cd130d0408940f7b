package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// The control-file tests mount a real lockfs in process (a real engine over
// the local backend) and drive it with real processes: flock(1), and a
// small Python program (ctlPy) that makes the exact calls a test needs and
// reports each errno.

// ctlMount is a mounted lockfs for one test.
type ctlMount struct {
	t   *testing.T
	src string // SOURCE
	dir string // mount point
	eng *lockmgr.Engine
	fs  *FS
}

// testLogWriter sends log lines to the test log.
type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newCtlMount mounts a fresh SOURCE, with allow_other so that tests can
// run processes as nobody. Everything is undone in t.Cleanup: unmount
// (lazily if busy), engine closed, Serve returned.
func newCtlMount(t *testing.T) *ctlMount {
	t.Helper()
	return newCtlMountConfig(t, nil)
}

// newCtlMountConfig is newCtlMount with the bazil server configuration
// that config returns; nil means ServerConfig.
func newCtlMountConfig(t *testing.T, config func(*FS) *fusefs.Config) *ctlMount {
	t.Helper()
	return newCtlMountAt(t, t.TempDir(), config)
}

// readerGoroutine marks the stack of a bazil reader goroutine (the fork's
// fs/serve.go readLoop): each mount has a few, started and ended as
// requests come.
const readerGoroutine = "bazil.org/fuse/fs.(*Server).readLoop"

// goroutinesChecked holds the tests whose first mount has registered
// CheckGoroutines (checkGoroutinesOnce).
var goroutinesChecked sync.Map

// checkGoroutinesOnce registers testutil.CheckGoroutines for t's first
// mount only: its check runs after every later mount's cleanup, whereas a
// later mount's would run while the first is still serving and count the
// first engine's goroutines (a process watch still finding heirs on a
// loaded machine) as its own leak.
func checkGoroutinesOnce(t testing.TB) {
	if _, checked := goroutinesChecked.LoadOrStore(t, true); checked {
		return
	}
	t.Cleanup(func() { goroutinesChecked.Delete(t) })
	testutil.CheckGoroutines(t, readerGoroutine)
}

// newCtlMountAt is newCtlMountConfig over an existing SOURCE, which
// several mounts (daemons) may share.
func newCtlMountAt(t *testing.T, src string, config func(*FS) *fusefs.Config) *ctlMount {
	t.Helper()
	// Registered first, so that it checks after the unmount below.
	// bazil's readers are left out: another mount of the same test starts
	// and ends its own at any time, and this mount's end when its Serve
	// returns, which the cleanup waits for (readerGoroutine).
	checkGoroutinesOnce(t)
	ptRequireFUSE(t, "flock")
	dir := t.TempDir()
	// Let the processes run as nobody reach both.
	for _, d := range []string{src, filepath.Dir(src)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	log := logrus.New()
	log.Out = testLogWriter{t}
	log.Level = logrus.InfoLevel
	if os.Getenv("LOCKFS_TEST_DEBUG") != "" {
		log.Level = logrus.DebugLevel
	}
	be, err := localbackend.New(localbackend.Config{Source: src, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := procinfo.NewTree(procinfo.TreeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := lockmgr.New(lockmgr.Config{Backend: be, Processes: procs, Logger: log, Host: "testhost"})
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := New(Config{Source: src, Engine: eng, Logger: log, Host: "testhost"})
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
	served := make(chan error, 1)
	if config == nil {
		go func() { served <- Serve(conn, fsys) }()
	} else {
		go func() { served <- fusefs.New(conn, config(fsys)).Serve(fsys) }()
	}
	t.Cleanup(func() {
		if err := fuse.Unmount(dir); err != nil {
			t.Logf("unmount %s: %v; lazy unmount", dir, err)
			if out, err := exec.Command("fusermount3", "-uz", dir).CombinedOutput(); err != nil {
				t.Errorf("fusermount3 -uz %s: %v: %s", dir, err, out)
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
		if err := fsys.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	pollProbe(t, src, dir)
	return &ctlMount{t: t, src: src, dir: dir, eng: eng, fs: fsys}
}

// mkdir creates directories in SOURCE, mode 0755.
func (m *ctlMount) mkdir(rels ...string) {
	m.t.Helper()
	for _, rel := range rels {
		if err := os.MkdirAll(filepath.Join(m.src, rel), 0o755); err != nil {
			m.t.Fatal(err)
		}
	}
}

// openHandles returns the number of open file descriptions of the control
// file rel (as "a/.lock") that the daemon has not yet seen released.
func (m *ctlMount) openHandles(rel string) int {
	dir, name := filepath.Split(rel)
	kind, ok := controlKind(name)
	if !ok {
		m.t.Fatalf("%s is no control file", rel)
	}
	return m.fs.ctl.OpenHandles(lockmgr.LockID{Path: cleanDirPath(dir), Kind: kind})
}

// path returns the path of rel in the mount.
func (m *ctlMount) path(rel string) string { return filepath.Join(m.dir, rel) }

// status reads a control file as root.
func (m *ctlMount) status(rel string) string {
	m.t.Helper()
	b, err := testutil.ReadNoPoll(m.path(rel))
	if err != nil {
		m.t.Fatalf("read %s: %v", rel, err)
	}
	return string(b)
}

// runExit runs a command to completion (killing it after timeout) and
// returns its exit status (-1 if killed) and combined output.
func runExit(t *testing.T, timeout time.Duration, name string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case ctx.Err() != nil:
		return -1, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("%s %v: %v", name, args, err)
	return 0, ""
}

// startLine starts a command in a session of its own and waits until it
// prints the line want on stdout. The group is SIGKILLed in t.Cleanup.
func startLine(t *testing.T, want string, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	testutil.StartChild(t, cmd).WaitLine(want, 10*time.Second)
	return cmd
}

// ctlPyScript serves one command per stdin line and answers one line each:
// "ok", "err ERRNO", or the command's result.
const ctlPyScript = `
import os, sys, fcntl, struct, json, errno
fds = {}
FL = {'ex': fcntl.LOCK_EX, 'sh': fcntl.LOCK_SH, 'un': fcntl.LOCK_UN}
TY = {'ex': fcntl.F_WRLCK, 'sh': fcntl.F_RDLCK, 'un': fcntl.F_UNLCK}
TYN = {v: k for k, v in TY.items()}
F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW = 36, 37, 38
def flk(typ):
    return struct.pack('hhqqi4x', typ, 0, 0, 0, 0)
print('ready %d' % os.getpid(), flush=True)
for line in sys.stdin:
    a = line.split()
    nb = 'nb' in a[3:]
    try:
        op = a[0]
        r = 'ok'
        if op == 'open':
            fds[a[1]] = os.open(a[2], os.O_RDWR | os.O_CREAT)
        elif op == 'opena':
            fds[a[1]] = os.open(a[2], os.O_WRONLY | os.O_APPEND)
        elif op == 'flock':
            fcntl.flock(fds[a[1]], FL[a[2]] | (fcntl.LOCK_NB if nb else 0))
        elif op == 'lockf':
            fcntl.lockf(fds[a[1]], FL[a[2]] | (fcntl.LOCK_NB if nb else 0))
        elif op == 'ofd':
            fcntl.fcntl(fds[a[1]], F_OFD_SETLK if nb else F_OFD_SETLKW, flk(TY[a[2]]))
        elif op in ('getlk', 'ofdgetlk'):
            res = fcntl.fcntl(fds[a[1]], fcntl.F_GETLK if op == 'getlk' else F_OFD_GETLK, flk(TY[a[2]]))
            t, _, s, l, pid = struct.unpack('hhqqi4x', res)
            r = 'lk %s %d' % (TYN[t], pid)
        elif op == 'write':
            n = os.write(fds[a[1]], json.loads(' '.join(a[2:])).encode())
            r = 'wrote %d' % n
        elif op == 'pwrite':
            n = os.pwrite(fds[a[1]], json.loads(' '.join(a[3:])).encode(), int(a[2]))
            r = 'wrote %d' % n
        elif op == 'read':
            r = 'read ' + json.dumps(os.pread(fds[a[1]], 65536, 0).decode())
        elif op == 'close':
            os.close(fds.pop(a[1]))
        elif op == 'exit':
            sys.exit(0)
        else:
            r = 'bad command'
    except OSError as e:
        r = 'err ' + ('EDEADLK' if e.errno == errno.EDEADLK else errno.errorcode.get(e.errno, str(e.errno)))
    print(r, flush=True)
`

// ctlPy is a running ctlPyScript.
type ctlPy struct {
	t     *testing.T
	child *testutil.Child
	pid   int
	in    io.WriteCloser
	lines <-chan string
}

// python returns the system Python, which every user can run.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "/usr/local/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	testutil.RequireTools(t, "python3")
	p, _ := exec.LookPath("python3")
	return p
}

// startPy starts the helper, as root (uid 0) or as another uid and gid.
func startPy(t *testing.T, uid, gid uint32) *ctlPy {
	t.Helper()
	cmd := exec.Command(python(t), "-c", ctlPyScript)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if uid != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid}
	}
	c := testutil.StartChild(t, cmd)
	p := &ctlPy{t: t, child: c, in: c.Stdin, lines: c.Lines}
	ready := p.reply(10 * time.Second)
	if _, err := fmt.Sscanf(ready, "ready %d", &p.pid); err != nil {
		t.Fatalf("python helper: %q", ready)
	}
	return p
}

// send sends a command without waiting for its answer.
func (p *ctlPy) send(format string, args ...any) {
	p.t.Helper()
	if _, err := fmt.Fprintf(p.in, format+"\n", args...); err != nil {
		p.t.Fatalf("python helper: %v", err)
	}
}

// reply waits for the next answer; "" if none came within timeout.
func (p *ctlPy) reply(timeout time.Duration) string {
	select {
	case l := <-p.lines: // an answer already there wins over timeout 0
		return l
	default:
	}
	select {
	case l := <-p.lines:
		return l
	case <-time.After(timeout):
		return ""
	}
}

// do sends a command and returns its answer.
func (p *ctlPy) do(format string, args ...any) string {
	p.t.Helper()
	p.send(format, args...)
	r := p.reply(10 * time.Second)
	if r == "" {
		p.t.Fatalf("python helper: no answer to %q", fmt.Sprintf(format, args...))
	}
	return r
}

// must runs a command that must answer want.
func (p *ctlPy) must(want, format string, args ...any) {
	p.t.Helper()
	if got := p.do(format, args...); got != want {
		p.t.Fatalf("%s: got %q, want %q", fmt.Sprintf(format, args...), got, want)
	}
}

// kill SIGKILLs the helper and waits for it to be gone.
func (p *ctlPy) kill() { p.child.Kill() }

func TestControlFilesAppearEverywhere(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a/b")
	for _, d := range []string{"", "a", "a/b"} {
		ents, err := os.ReadDir(m.path(d))
		if err != nil {
			t.Fatal(err)
		}
		// Hidden from readdir (SPEC §1), found by name.
		for _, e := range ents {
			if _, ok := controlKind(e.Name()); ok {
				t.Errorf("%q lists %s", d, e.Name())
			}
		}
		for _, n := range []string{".lock", ".lock_newdir", ".lock_usage"} {
			fi, err := os.Stat(m.path(filepath.Join(d, n)))
			if err != nil {
				t.Fatal(err)
			}
			if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o666 || fi.Size() != 0 {
				t.Errorf("%s/%s: mode %v size %d, want a regular empty 0666 file", d, n, fi.Mode(), fi.Size())
			}
		}
	}
	// The owner is the directory's owner; the inode is stable and differs
	// per kind and directory.
	if err := os.Chown(filepath.Join(m.src, "a"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the owner of a/.lock to follow a's", func() bool {
		fi, err := os.Stat(m.path("a/.lock"))
		return err == nil && fi.Sys().(*syscall.Stat_t).Uid == 65534
	})
	ino := func(rel string) uint64 {
		fi, err := os.Stat(m.path(rel))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	if ino("a/.lock") != ino("a/.lock") || ino("a/.lock") == ino("a/.lock_usage") || ino("a/.lock") == ino("a/b/.lock") {
		t.Errorf("inodes: a/.lock %d, a/.lock_usage %d, a/b/.lock %d", ino("a/.lock"), ino("a/.lock_usage"), ino("a/b/.lock"))
	}
}

func TestControlFileStatusRead(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a/b")
	got := m.status("a/b/.lock_newdir")
	want := "lock a/b/.lock_newdir\nkind newdir\nmode none\nimplicit 0\nwaiters 0\nlease none\n"
	if got != want {
		t.Errorf("status of a free lock:\n%s\nwant:\n%s", got, want)
	}
	// cat reads through the page-cache bypass despite size 0.
	code, out := runExit(t, 10*time.Second, "cat", m.path(".lock"))
	if code != 0 || !strings.HasPrefix(out, "lock .lock\nkind dir\n") {
		t.Errorf("cat .lock: exit %d, %q", code, out)
	}

	holder := startPy(t, 0, 0)
	holder.must("ok", "open f %s", m.path("a/b/.lock"))
	holder.must("ok", "flock f ex")
	holder.must("wrote 14", `write f "deploying v1.2"`)

	st := m.status("a/b/.lock")
	wantHolder := fmt.Sprintf("holder host=testhost pid=%d uid=0 mode=exclusive ", holder.pid)
	if !strings.Contains(st, "\nmode exclusive\n") || !strings.Contains(st, wantHolder) ||
		!strings.Contains(st, ` explicit note="deploying v1.2"`) || !strings.HasSuffix(st, "\nlease exclusive\n") {
		t.Errorf("status while held:\n%s", st)
	}
	if strings.Contains(st, "you holder") {
		t.Errorf("a reader through another descriptor is told it holds the lock:\n%s", st)
	}
	// Ancestors are held implicitly.
	if st := m.status("a/.lock"); !strings.Contains(st, "\nmode shared\n") || !strings.Contains(st, "\nimplicit 1\n") {
		t.Errorf("status of the parent:\n%s", st)
	}

	// Through the holding descriptor, the reader's token comes first.
	r := holder.do("read f")
	if !strings.HasPrefix(r, `read "you holder token=`) || !strings.Contains(r, " explicit you note=") {
		t.Errorf("status through the holder's descriptor: %s", r)
	}

	// Identities are hidden from other users, and shown to the holder's uid.
	other := startPy(t, 65534, 65534)
	other.must("ok", "open f %s", m.path("a/b/.lock"))
	r = other.do("read f")
	if !strings.Contains(r, `holder mode=exclusive explicit hidden\n`) || strings.Contains(r, "deploying") || strings.Contains(r, "pid=") {
		t.Errorf("status as another user: %s", r)
	}
}

func TestControlFileNote(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a", "b")
	// The shell idiom: a descriptor on the lock file, flock on it, then
	// the pid written to it. exec 9> opens with O_TRUNC.
	sh := startLine(t, "ready", "bash", "-c",
		fmt.Sprintf(`exec 9>%s && flock -x 9 && echo $$ >&9 && echo x >&9 && echo ready && exec sleep 60`, m.path("a/.lock")))
	st := m.status("a/.lock")
	if want := fmt.Sprintf(`note="%d\nx"`, sh.Process.Pid); !strings.Contains(st, want) {
		t.Errorf("status lacks %s:\n%s", want, st)
	}
	// Control: another directory's status has no holder and no note.
	if st := m.status("b/.lock"); strings.Contains(st, "note=") || strings.Contains(st, "holder") {
		t.Errorf("b/.lock shows a holder:\n%s", st)
	}

	// 1 KiB is the limit, per open file description.
	p := startPy(t, 0, 0)
	p.must("ok", "open f %s", m.path("b/.lock"))
	p.must("wrote 1024", `write f "%s"`, strings.Repeat("y", 1024))
	p.must("err EFBIG", `write f "z"`)
	p.must("ok", "open g %s", m.path("b/.lock"))
	p.must("err EFBIG", `write g "%s"`, strings.Repeat("y", 1025))
	p.must("wrote 10", `write g "%s"`, strings.Repeat("y", 10))
}

func TestControlFileMetadataRefused(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a")
	f := m.path("a/.lock")
	// Accepted and without effect: touch, O_TRUNC, O_CREAT.
	for _, c := range [][]string{{"touch", f}, {"bash", "-c", ": > " + f}, {"flock", "-n", f, "true"}} {
		if code, out := runExit(t, 10*time.Second, c[0], c[1:]...); code != 0 {
			t.Errorf("%v: exit %d: %s", c, code, out)
		}
	}
	if err := os.Chmod(f, 0o600); !errors.Is(err, syscall.EPERM) {
		t.Errorf("chmod: %v, want EPERM", err)
	}
	if err := os.Chown(f, 65534, 65534); !errors.Is(err, syscall.EPERM) {
		t.Errorf("chown: %v, want EPERM", err)
	}
	// truncate(f, 0) is indistinguishable from O_TRUNC: accepted, a no-op.
	if err := os.Truncate(f, 0); err != nil {
		t.Errorf("truncate to 0: %v", err)
	}
	if err := os.Truncate(f, 10); !errors.Is(err, syscall.EPERM) {
		t.Errorf("truncate to 10: %v, want EPERM", err)
	}
	if err := os.Remove(f); !errors.Is(err, syscall.EPERM) {
		t.Errorf("unlink: %v, want EPERM", err)
	}
	if err := os.Mkdir(m.path("a/.lock_usage"), 0o755); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("mkdir .lock_usage: %v, want EEXIST", err)
	}
	fi, err := os.Stat(f)
	if err != nil || fi.Mode().Perm() != 0o666 || fi.Size() != 0 {
		t.Errorf("after the refused changes: %v %v", fi.Mode(), err)
	}
	// Control: mkdir of an unreserved name works.
	if err := os.Mkdir(m.path("a/sub"), 0o755); err != nil {
		t.Errorf("mkdir a/sub: %v", err)
	}
}
