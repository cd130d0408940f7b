package fs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"

	"github.com/lockfs/lockfs/fs/internal/fstest"
)

// openToTheLimit raises its soft descriptor limit to its hard one (at most
// 30,000), opens the files named in its arguments in turn, read-only,
// until an error, and prints how many it got, the errno ("none" if it
// stopped at the limit without one), how many descriptors it held before
// (its own) and the limit; it keeps them open until its stdin closes.
const openToTheLimit = `
import os, sys, resource, errno
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
limit = min(hard, 30000)
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
own = len(os.listdir('/proc/self/fd')) - 1
paths = sys.argv[1:]
fds, err = [], 'none'
while len(fds) < limit:
    try:
        fds.append(os.open(paths[len(fds) % len(paths)], os.O_RDONLY))
    except OSError as e:
        err = errno.errorcode[e.errno]
        break
print(len(fds), err, own, limit, flush=True)
sys.stdin.read()
`

// requireDetaching calls Missing unless m's opens use passthrough and
// can be detached (detach.go).
func requireDetaching(t *testing.T, m *ptMount) {
	t.Helper()
	if on, why := m.fs.PassthroughState(); !on {
		testutil.Missing(t, "FUSE passthrough is off: %s", why)
	}
	if m.fs.byHandle == nil {
		testutil.Missing(t, "inodes of SOURCE cannot be opened by file handle: %s", m.fs.noHandles)
	}
}

// openLimitScenario mounts a fresh SOURCE of 100 files with a per-uid cap
// of 50, with or without passthrough, and has a process open them in turn
// until an error (openToTheLimit). It returns what the process printed,
// and how many more descriptors the daemon (this process) held while the
// process held its own than before it started.
func openLimitScenario(t *testing.T, passthrough bool) (got string, own, limit, daemonMore int) {
	t.Helper()
	testutil.RequireRoot(t, "FUSE passthrough needs CAP_SYS_ADMIN")
	m := newPTMountAt(t, t.TempDir(), t.TempDir(), withPassthrough(passthrough), func(c *Config) { c.MaxOpenPerUID = 50 })
	if passthrough {
		requireDetaching(t, m)
	}
	args := []string{"-c", openToTheLimit}
	for i := range 100 {
		name := fmt.Sprintf("f%d", i)
		if err := os.WriteFile(m.s(name), []byte("data\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, m.m(name))
	}
	before := testutil.OpenFds(t)
	cmd := exec.Command(fstest.Python(t), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	c := testutil.StartChild(t, cmd)
	line := strings.Fields(c.Line(5 * time.Minute))
	if len(line) != 4 {
		t.Fatalf("the opener printed %q", line)
	}
	daemonMore = testutil.OpenFds(t) - before
	own, _ = strconv.Atoi(line[2])
	limit, _ = strconv.Atoi(line[3])
	return line[0] + " " + line[1], own, limit, daemonMore
}

// TestPassthroughOpensCostNoDescriptor (issue 31 item 17): with
// passthrough, a process opens files through the mount until its own
// RLIMIT_NOFILE stops it, as on a local file system, past the per-uid cap
// of 50, while the daemon holds no more descriptors than before. Control:
// without passthrough every open holds a descriptor of the daemon, and the
// cap stops the process at 50.
func TestPassthroughOpensCostNoDescriptor(t *testing.T) {
	testutil.RequireTools(t, "python3")
	t.Run("passthrough", func(t *testing.T) {
		got, own, limit, more := openLimitScenario(t, true)
		want := fmt.Sprintf("%d EMFILE", limit-own)
		if limit == 30000 {
			want = "30000 none" // a hard limit above the script's bound
		}
		if got != want {
			t.Errorf("a process allowed %d descriptors, %d of them its own, got %q from the mount, want %q", limit, own, got, want)
		}
		if more > 20 {
			t.Errorf("the daemon held %d more descriptors while the process held its opens, want about none", more)
		}
		t.Logf("opened %s (limit %d, own %d); daemon descriptors %+d", got, limit, own, more)
	})
	t.Run("control without passthrough", func(t *testing.T) {
		got, _, _, more := openLimitScenario(t, false)
		if got != "50 EMFILE" {
			t.Errorf("without passthrough: got %q, want 50 EMFILE (the cap: each open holds a descriptor)", got)
		}
		if more < 50 {
			t.Errorf("without passthrough the daemon held %d more descriptors, want the 50 opens'", more)
		}
	})
}

// TestDetachedFlock: a detached handle's flock(2) lock is a lock on the
// backing file (a flock on SOURCE directly fails while it is held), its
// descriptor counts towards the per-uid cap while the lock is held (at the
// cap a new lock gets ENOLCK; a lock refused keeps none) and goes at
// LOCK_UN and at close.
func TestDetachedFlock(t *testing.T) {
	testutil.RequireRoot(t, "FUSE passthrough needs CAP_SYS_ADMIN")
	testutil.RequireTools(t, "flock")
	m := newPTMountAt(t, t.TempDir(), t.TempDir(), func(c *Config) { c.MaxOpenPerUID = 2 })
	requireDetaching(t, m)
	for _, f := range []string{"f", "g", "h"} {
		if err := os.WriteFile(m.s(f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	held := func(name string) bool {
		err := exec.Command("flock", "-n", m.s(name), "true").Run()
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 {
			return true
		}
		if err != nil {
			t.Fatalf("flock -n %s: %v", name, err)
		}
		return false
	}
	count := func(want int) {
		t.Helper()
		testutil.Eventually(t, fmt.Sprintf("%d descriptors counted for uid 0", want), func() bool { return m.fs.handles.count(0) == want })
	}
	p := fstest.StartPy(t, 0, 0)
	for _, f := range []string{"f", "g", "h"} {
		p.Must("ok", "open %s %s", f, m.m(f))
	}
	count(0) // three opens, no descriptor (the cap is 2)
	p.Must("ok", "flock f ex nb")
	count(1)
	if !held("f") {
		t.Errorf("flock through the mount does not exclude a flock on SOURCE")
	}
	q := fstest.StartPy(t, 0, 0) // a lock that fails keeps no descriptor
	q.Must("ok", "open f %s", m.m("f"))
	q.Must("err EAGAIN", "flock f ex nb")
	count(1)
	p.Must("ok", "flock g ex nb")
	p.Must("err ENOLCK", "flock h ex nb")
	p.Must("ok", "flock f un")
	count(1)
	if held("f") {
		t.Errorf("f still locked on SOURCE after LOCK_UN")
	}
	p.Must("ok", "flock h ex nb") // f's place
	p.Must("ok", "close g")
	count(1)
	testutil.Eventually(t, "g's lock to end at close", func() bool { return !held("g") })
	if !held("h") {
		t.Errorf("h's lock ended with g's")
	}
}

// nodeOf returns the node of the file at path in SOURCE (by its whole
// key: an inode number freed by an earlier file may be reused).
func nodeOf(t *testing.T, m *ptMount, path string) *node {
	t.Helper()
	var st inodeStat
	if err := lstatAt(unix.AT_FDCWD, path, &st); err != nil {
		t.Fatal(err)
	}
	pn := m.fs.lookupNode(keyOf(&st))
	if pn == nil {
		t.Fatalf("no node for %s", path)
	}
	return pn.base()
}

// TestDetachedUnlinked: a file open through the mount with a detached
// handle and then unlinked on SOURCE directly (behind the daemon's back:
// no name of it is left to find it by) keeps working as on a local file
// system: fstat, writes, ftruncate, fsync, flock, byte-range locks, and a
// new open through /proc/self/fd. The control drops the node's file handle:
// then a request that needs the inode fails, so the test does reach it
// through the handle.
func TestDetachedUnlinked(t *testing.T) {
	testutil.RequireRoot(t, "FUSE passthrough needs CAP_SYS_ADMIN")
	m := newPTMountAt(t, t.TempDir(), t.TempDir())
	requireDetaching(t, m)
	if err := os.WriteFile(m.s("u"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(m.m("u"), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	node := nodeOf(t, m, m.s("u"))
	node.mu.Lock()
	detached := node.detached
	node.mu.Unlock()
	if detached != 1 {
		t.Fatalf("%d detached handles, want 1", detached)
	}
	if err := os.Remove(m.s("u")); err != nil {
		t.Fatal(err)
	}
	size := func(want int64) {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Size != want {
			t.Errorf("fstat: size %d, %v; want %d", st.Size, err, want)
		}
	}
	if _, err := unix.Pwrite(fd, []byte(" world"), 5); err != nil {
		t.Fatal(err)
	}
	size(11)
	if err := unix.Ftruncate(fd, 3); err != nil {
		t.Fatalf("ftruncate of the unlinked file: %v", err)
	}
	size(3)
	if err := unix.Fsync(fd); err != nil {
		t.Errorf("fsync: %v", err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("flock: %v", err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk); err != nil {
		t.Errorf("F_SETLK: %v", err)
	}
	lk.Type = unix.F_UNLCK
	if err := unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk); err != nil {
		t.Errorf("F_SETLK unlock: %v", err)
	}
	if err := unix.Flock(fd, unix.LOCK_UN); err != nil {
		t.Errorf("LOCK_UN: %v", err)
	}
	again, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open again through /proc/self/fd: %v", err)
	}
	buf := make([]byte, 16)
	n, err := unix.Pread(again, buf, 0)
	unix.Close(again)
	if err != nil || string(buf[:n]) != "hel" {
		t.Errorf("read of the new open: %q, %v", buf[:n], err)
	}

	// Control: without the file handle nothing finds the inode.
	node.mu.Lock()
	node.fhOK = false
	node.mu.Unlock()
	if err := unix.Ftruncate(fd, 1); err == nil {
		t.Errorf("control: ftruncate succeeded without the file handle")
	}
	node.mu.Lock()
	node.fhOK = true
	node.mu.Unlock()
	if err := unix.Ftruncate(fd, 2); err != nil {
		t.Errorf("ftruncate with the file handle back: %v", err)
	}
}

// TestPTBackingFileOutlivesItsID: once the kernel has processed an open
// reply naming a backing id, it holds the backing file for that open
// itself (fs/fuse/passthrough.c fuse_passthrough_open takes a reference
// and opens a backing file per open): with the id closed
// (FUSE_DEV_IOC_BACKING_CLOSE) while the file is open, and the daemon
// holding no descriptor of the file (the handle is detached), writes and
// reads of that open still reach SOURCE. This is what lets the daemon keep
// nothing per open. Control: a new open that names the closed id fails, so
// the id really is gone.
func TestPTBackingFileOutlivesItsID(t *testing.T) {
	testutil.RequireRoot(t, "FUSE passthrough needs CAP_SYS_ADMIN")
	m := newPTMountAt(t, t.TempDir(), t.TempDir())
	requireDetaching(t, m)
	if err := os.WriteFile(m.s("f"), []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(m.m("f"), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	n := nodeOf(t, m, m.s("f"))
	p := &m.fs.pt
	p.mu.Lock()
	io := p.inodes[n.self.(*File)]
	var id int32
	if io != nil {
		id = io.id
	}
	if id != 0 {
		err = p.conn.BackingClose(id)
	}
	p.mu.Unlock()
	if id == 0 || err != nil {
		t.Fatalf("backing id %d of the open file, closed: %v", id, err)
	}
	if _, err := unix.Pwrite(fd, []byte("after!"), 0); err != nil {
		t.Fatalf("write after the id was closed: %v", err)
	}
	if got, err := os.ReadFile(m.s("f")); err != nil || string(got) != "after!" {
		t.Errorf("SOURCE after a write through the open: %q, %v", got, err)
	}
	if err := os.WriteFile(m.s("f"), []byte("SOURCE"), 0o644); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if k, err := unix.Pread(fd, buf, 0); err != nil || string(buf[:k]) != "SOURCE" {
		t.Errorf("read through the open after the id was closed: %q, %v (want SOURCE's bytes)", buf[:k], err)
	}
	if again, err := unix.Open(m.m("f"), unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		unix.Close(again)
		t.Errorf("control: an open naming the closed backing id %d succeeded", id)
	}
}

// TestDetachedRequests: the requests a detached handle may still get (a
// read or write the kernel did not pass through, fallocate, SEEK_DATA)
// are served from a descriptor opened by file handle for the request,
// with the handle's flags (O_APPEND kept), and leave no descriptor
// behind. The handle is one made as detach makes it, for a file unlinked
// from SOURCE. Control: without the node's file handle they fail.
func TestDetachedRequests(t *testing.T) {
	testutil.RequireRoot(t, "FUSE passthrough needs CAP_SYS_ADMIN")
	m := newPTMountAt(t, t.TempDir(), t.TempDir())
	requireDetaching(t, m)
	if err := os.WriteFile(m.s("f"), []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(m.m("f"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	n := nodeOf(t, m, m.s("f"))
	if err := os.Remove(m.s("f")); err != nil {
		t.Fatal(err)
	}
	h := &fileHandle{n: n.self.(*File), key: n.key, of: &openFile{fd: -1, write: true}, flags: unix.O_WRONLY | unix.O_APPEND, io: ioPassthrough}
	rh := &fileHandle{n: n.self.(*File), key: n.key, of: &openFile{fd: -1}, flags: unix.O_RDONLY, io: ioPassthrough}
	ctx := context.Background()
	before := testutil.OpenFds(t)
	var wresp fuse.WriteResponse
	if err := h.Write(ctx, &fuse.WriteRequest{Offset: 0, Data: []byte("ab")}, &wresp); err != nil || wresp.Size != 2 {
		t.Fatalf("write: %d, %v", wresp.Size, err)
	}
	rresp := fuse.ReadResponse{Data: make([]byte, 0, 64)}
	if err := rh.Read(ctx, &fuse.ReadRequest{Offset: 0, Size: 64}, &rresp); err != nil || string(rresp.Data) != "0123456789ab" {
		t.Errorf("read: %q, %v; want the write appended (O_APPEND)", rresp.Data, err)
	}
	if err := h.FAllocate(ctx, &fuse.FAllocateRequest{Header: fuse.Header{Uid: 0}, Offset: 0, Length: 8192}); err != nil {
		t.Errorf("fallocate: %v", err)
	}
	var lresp fuse.LseekResponse
	if err := rh.Lseek(ctx, &fuse.LseekRequest{Offset: 0, Whence: unix.SEEK_DATA}, &lresp); err != nil || lresp.Offset != 0 {
		t.Errorf("SEEK_DATA: %d, %v", lresp.Offset, err)
	}
	if after := testutil.OpenFds(t); after > before {
		t.Errorf("%d descriptors after the requests, %d before", after, before)
	}

	// Control: without the file handle, nothing finds the unlinked file.
	n.mu.Lock()
	n.fh = unix.NewFileHandle(0, nil)
	n.mu.Unlock()
	if err := rh.Read(ctx, &fuse.ReadRequest{Offset: 0, Size: 64}, &fuse.ReadResponse{Data: make([]byte, 0, 64)}); err == nil {
		t.Errorf("control: a read without the file handle succeeded")
	}
}

// TestOpenFilesCostNothing: lockfs doctor's check says yes for a SOURCE on
// this host's disk (as root) and no, naming name_to_handle_at, for one on
// procfs, which has no file handles (the control).
func TestOpenFilesCostNothing(t *testing.T) {
	testutil.RequireRoot(t, "open_by_handle_at needs CAP_DAC_READ_SEARCH")
	if ok, why := OpenFilesCostNothing(t.TempDir()); !ok {
		t.Errorf("a temporary directory: %s", why)
	}
	if ok, why := OpenFilesCostNothing("/proc/self"); ok || !strings.Contains(why, "name_to_handle_at") {
		t.Errorf("control, procfs: %v, %q", ok, why)
	}
}

// TestDetachKeepsOtherFileSystems: a file on another file system mounted
// beneath SOURCE (a tmpfs) cannot be opened by SOURCE's file handles, so
// its passthrough open is registered by reopening the handle's own
// descriptor and keeps it, and it reads and writes as any file. Control: a
// file of SOURCE's own file system opened the same way is detached, its
// registration having proved the node's file handle. (Two guards keep the
// tmpfs file from being opened by a handle of SOURCE's: handleOf's mount
// id and backingFd's fallback to a reopen; with both removed the open is
// not passed through and this test fails.)
func TestDetachKeepsOtherFileSystems(t *testing.T) {
	testutil.RequireRoot(t, "FUSE passthrough needs CAP_SYS_ADMIN; mounting a tmpfs, CAP_SYS_ADMIN")
	src := t.TempDir()
	sub := src + "/sub"
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount a tmpfs beneath SOURCE: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	m := newPTMountAt(t, src, t.TempDir())
	requireDetaching(t, m)
	for _, name := range []string{"f", "sub/f"} {
		if err := os.WriteFile(m.s(name), []byte("data\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	open := func(name string) (detached, kept int, fhOK bool) {
		t.Helper()
		f, err := os.OpenFile(m.m(name), os.O_RDWR|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString("more\n"); err != nil {
			t.Errorf("%s: write: %v", name, err)
		}
		if b, err := os.ReadFile(m.s(name)); err != nil || string(b) != "data\nmore\n" {
			t.Errorf("%s: SOURCE holds %q, %v", name, b, err)
		}
		n := nodeOf(t, m, m.s(name))
		m.fs.pt.mu.Lock()
		var pt int
		if io := m.fs.pt.inodes[n.self.(*File)]; io != nil {
			pt = io.pt
		}
		m.fs.pt.mu.Unlock()
		if pt != 1 {
			t.Fatalf("%s: %d handles open for passthrough, want 1", name, pt)
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		return int(n.detached), len(n.open), n.fhOK
	}
	if detached, kept, _ := open("sub/f"); detached != 0 || kept != 1 {
		t.Errorf("a file on the tmpfs beneath SOURCE: %d detached handles, %d descriptors kept; want 0 and 1", detached, kept)
	}
	if detached, kept, fhOK := open("f"); detached != 1 || kept != 0 || !fhOK {
		t.Errorf("control, a file of SOURCE: %d detached handles, %d descriptors kept, file handle known %v; want 1, 0, true", detached, kept, fhOK)
	}
}
