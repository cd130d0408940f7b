package fs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/fs/internal/fstest"
	"github.com/lockfs/lockfs/internal/testutil"
)

// Tests of the data path with FUSE passthrough (passthrough.go) and
// without. Each runs in both modes: the mode without is the control that
// proves the check can see the daemon's requests.

// opCounter counts the FUSE requests a mount answers, by operation
// (Config.ObserveOp, told once each request is answered).
type opCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *opCounter) observe(op string, _ time.Duration) {
	c.mu.Lock()
	c.n[op]++
	c.mu.Unlock()
}

func (c *opCounter) get(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op]
}

// newModeMount mounts a fresh SOURCE with passthrough on or off and counts
// its requests. With on, passthrough must be in effect: the tests run as
// root (they fail without it in CI, fstest.RequireFUSE) on a kernel with it.
func newModeMount(t *testing.T, on bool) (*ptMount, *opCounter) {
	t.Helper()
	c := &opCounter{n: map[string]int{}}
	src, mnt := t.TempDir(), t.TempDir()
	m := newPTMountAt(t, src, mnt, withPassthrough(on), func(cfg *Config) { cfg.ObserveOp = c.observe })
	got, why := m.fs.PassthroughState()
	if got != on {
		if on && os.Getenv("CI") != "true" && os.Geteuid() != 0 {
			t.Skipf("passthrough unavailable: %s", why)
		}
		t.Fatalf("passthrough %v, want %v: %s", got, on, why)
	}
	return m, c
}

// settle waits until a create made after the I/O under test has been
// counted, so that the counts of requests answered before it are in. (A
// create always reaches the daemon; a getattr may be answered from the
// kernel's attribute cache.)
func settle(t *testing.T, m *ptMount, c *opCounter) {
	t.Helper()
	before := c.get("create")
	name := fmt.Sprintf("settle-%d", time.Now().UnixNano())
	fd, err := unix.Open(m.m(name), unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	testutil.Eventually(t, "the settle create to be counted", func() bool { return c.get("create") > before })
}

func modeName(on bool) string {
	if on {
		return "passthrough"
	}
	return "fallback"
}

// TestPTPassthroughBypassesDaemon: with passthrough the daemon sees no
// read or write request while a file is written and read, a file written
// in SOURCE is read, and a file is written and read through a shared
// mapping; the bytes are in SOURCE. Control: with --passthrough=off the
// same I/O reaches the daemon as read and write requests (the read of the
// file written in SOURCE at least: the kernel may keep the pages it wrote,
// FOPEN_KEEP_CACHE, docs/DATA-PATH.md).
func TestPTPassthroughBypassesDaemon(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(modeName(on), func(t *testing.T) {
			m, c := newModeMount(t, on)
			data := bytes.Repeat([]byte("0123456789abcdef"), 256<<10/16*16) // 4 MiB
			if err := os.WriteFile(m.m("f"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(m.m("f"))
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read back: %d bytes, %v", len(got), err)
			}
			// A file the kernel has never cached: written in SOURCE.
			if err := os.WriteFile(m.s("g"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(m.m("g")); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read of a file written in SOURCE: %d bytes, %v", len(got), err)
			}
			// Through a shared mapping, in another process (mmapPy).
			mmapPy(t, `
m = mapped(sys.argv[1])
m[1<<20:(1<<20)+6] = b"mapped"
total = sum(m[i] for i in range(0, len(m), 4096))
m.flush()
print("ok")
`, m.m("f"))
			onSource, err := os.ReadFile(m.s("f"))
			if err != nil {
				t.Fatal(err)
			}
			copy(data[1<<20:], "mapped")
			if !bytes.Equal(onSource, data) {
				t.Fatal("SOURCE does not hold what was written through the mount")
			}
			settle(t, m, c)
			reads, writes := c.get("read"), c.get("write")
			t.Logf("%s: the daemon answered %d reads, %d writes", modeName(on), reads, writes)
			if on && reads+writes != 0 {
				t.Errorf("passthrough: the daemon answered %d reads and %d writes, want none", reads, writes)
			}
			if !on && (reads == 0 || writes == 0) {
				t.Errorf("control: the daemon answered %d reads and %d writes, want some of each", reads, writes)
			}
		})
	}
}

// TestPTMmapCoherentWithSource: with passthrough a shared mapping made
// through the mount is SOURCE's page cache: bytes written in SOURCE show
// in it at once, and bytes stored in it show in SOURCE, with no msync and
// no reopen. Control: the fallback mount's mapping is filled by read
// requests to the daemon (its own page cache), which the passthrough
// mount never sends.
func TestPTMmapCoherentWithSource(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(modeName(on), func(t *testing.T) {
			m, c := newModeMount(t, on)
			const size = 64 << 10
			if err := os.WriteFile(m.s("f"), bytes.Repeat([]byte{'a'}, size), 0o644); err != nil {
				t.Fatal(err)
			}
			if !on {
				mmapPy(t, `
m = mapped(sys.argv[1])
assert m[100:101] == b"a", m[100:101]
print("ok")
`, m.m("f"))
				settle(t, m, c)
				if c.get("read") == 0 {
					t.Error("control: the fallback mapping was filled without a read request")
				}
				return
			}
			// One process maps the file through the mount and writes
			// SOURCE directly, with no msync and no reopen in between.
			mmapPy(t, `
m = mapped(sys.argv[1])
assert m[100:101] == b"a", m[100:101]
src = os.open(sys.argv[2], os.O_RDWR)
os.pwrite(src, b"from-source", 100)
assert m[100:111] == b"from-source", ("the mapping after a write in SOURCE", m[100:111])
m[5000:5012] = b"from-mapping"
got = os.pread(src, 12, 5000)
assert got == b"from-mapping", ("SOURCE after a store into the mapping", got)
print("ok")
`, m.m("f"), m.s("f"))
			settle(t, m, c)
			if n := c.get("read") + c.get("write"); n != 0 {
				t.Errorf("passthrough: %d read/write requests reached the daemon", n)
			}
		})
	}
}

// fileState is what a test compares between a file used through the
// mount and one used the same way directly on the same file system.
type fileState struct {
	Size, Blocks int64
	Data         string // hash-free: the files are small
	Extents      string // SEEK_DATA/SEEK_HOLE walk
}

func stateOf(t *testing.T, path string) fileState {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var ext bytes.Buffer
	for off := int64(0); off < st.Size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: only a hole is left
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&ext, "[%d,%d)", d, h)
		off = h
	}
	return fileState{Size: st.Size, Blocks: st.Blocks, Data: fmt.Sprintf("%x", data), Extents: ext.String()}
}

// TestPTFileOpsAsOnSource: O_APPEND (with a writer in SOURCE between two
// appends), truncate, fallocate (keep-size and hole punching), sparse
// writes and O_DIRECT give through the mount, in both modes, the same
// size, bytes, blocks and extents as the same calls made directly on a
// file of SOURCE's file system.
func TestPTFileOpsAsOnSource(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(modeName(on), func(t *testing.T) {
			m, _ := newModeMount(t, on)
			ref := m.s("ref") // the reference, used directly
			// ops runs the calls on path; other is the path under which
			// "another program" reaches the same file in SOURCE.
			ops := func(path, other string) {
				t.Helper()
				must := func(what string, err error) {
					t.Helper()
					if err != nil {
						t.Fatalf("%s on %s: %v", what, path, err)
					}
				}
				fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND|unix.O_CLOEXEC, 0o644)
				must("open O_APPEND", err)
				_, err = unix.Write(fd, []byte("first."))
				must("append", err)
				must("write in SOURCE", appendTo(other, "other."))
				_, err = unix.Pwrite(fd, []byte("second."), 0) // O_APPEND: at the end anyway
				must("append at 0", err)
				unix.Close(fd)

				fd, err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
				must("open", err)
				defer unix.Close(fd)
				must("truncate down", unix.Ftruncate(fd, 10))
				must("truncate up", unix.Ftruncate(fd, 1000))
				_, err = unix.Pwrite(fd, []byte("sparse"), 8<<20) // a hole of 8 MiB
				must("sparse write", err)
				must("fallocate keep-size", unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 16<<20, 1<<20))
				must("fallocate", unix.Fallocate(fd, 0, 4<<20, 256<<10))
				must("punch hole", unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 4<<20, 64<<10))

				dfd, err := unix.Open(path, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
				must("open O_DIRECT", err)
				defer unix.Close(dfd)
				buf := alignedBuf(8192)
				copy(buf, bytes.Repeat([]byte("direct!!"), 1024))
				n, err := unix.Pwrite(dfd, buf, 12<<20)
				must("O_DIRECT write", err)
				if n != len(buf) {
					t.Fatalf("O_DIRECT write on %s: %d of %d bytes", path, n, len(buf))
				}
				back := alignedBuf(8192)
				n, err = unix.Pread(dfd, back, 12<<20)
				must("O_DIRECT read", err)
				if n != len(buf) || !bytes.Equal(back, buf) {
					t.Fatalf("O_DIRECT read on %s: %d bytes, equal %v", path, n, bytes.Equal(back, buf))
				}
				must("fsync", unix.Fsync(fd))
			}
			ops(ref, ref)
			ops(m.m("f"), m.s("f"))
			want, got := stateOf(t, ref), stateOf(t, m.s("f"))
			if got != want {
				t.Errorf("through the mount: size %d blocks %d extents %s; directly: size %d blocks %d extents %s; same bytes: %v",
					got.Size, got.Blocks, got.Extents, want.Size, want.Blocks, want.Extents, got.Data == want.Data)
			}
			if through := stateOf(t, m.m("f")); through != got {
				t.Errorf("the mount shows size %d blocks %d extents %s for a file that has size %d blocks %d extents %s",
					through.Size, through.Blocks, through.Extents, got.Size, got.Blocks, got.Extents)
			}
		})
	}
}

// appendTo appends s to the file at path, as another program would.
func appendTo(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// alignedBuf returns n bytes aligned for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := 4096 - int(uintptr(unsafe.Pointer(&b[0]))%4096)
	return b[off : off+n]
}

// TestPTPassthroughSharesOneBackingID: opens of one inode, by two names
// (hard links) and two descriptors at once, all use the inode's one
// backing id (else the kernel fails the second with EIO); after every
// one is closed the id is dropped, and a new open registers a new one.
func TestPTPassthroughSharesOneBackingID(t *testing.T) {
	m, c := newModeMount(t, true)
	if err := os.WriteFile(m.s("a"), []byte("shared"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(m.s("a"), m.s("b")); err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, name := range []string{"a", "b", "a"} {
		fd, err := unix.Open(m.m(name), unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("open %s while the inode is open: %v", name, err)
		}
		fds = append(fds, fd)
	}
	buf := make([]byte, 6)
	for i, fd := range fds {
		if n, err := unix.Pread(fd, buf, 0); err != nil || string(buf[:n]) != "shared" {
			t.Errorf("descriptor %d reads %q, %v", i, buf[:n], err)
		}
	}
	// One inode, once the mount's poll probe (fstest.PollProbe) is released:
	// the kernel sends its RELEASE after close(2) has returned.
	testutil.Eventually(t, "one inode tracked for passthrough", func() bool {
		m.fs.pt.mu.Lock()
		defer m.fs.pt.mu.Unlock()
		return len(m.fs.pt.inodes) == 1
	})
	for _, fd := range fds {
		unix.Close(fd)
	}
	testutil.Eventually(t, "the backing id to be dropped after the last close", func() bool {
		m.fs.pt.mu.Lock()
		defer m.fs.pt.mu.Unlock()
		return len(m.fs.pt.inodes) == 0
	})
	if got, err := os.ReadFile(m.m("b")); err != nil || string(got) != "shared" {
		t.Errorf("reopen after the id was dropped: %q, %v", got, err)
	}
	settle(t, m, c)
	if n := c.get("read"); n != 0 {
		t.Errorf("%d read requests reached the daemon", n)
	}
}

// TestPTPassthroughFallsBack: when BACKING_OPEN fails the file is served
// through the daemon, without error to the caller, and the failure is
// logged once; an inode with such an open takes no passthrough open
// until it is closed (the kernel would refuse it with EIO). EPERM turns
// passthrough off for the mount, visible in PassthroughState.
func TestPTPassthroughFallsBack(t *testing.T) {
	m, c := newModeMount(t, true)
	for _, name := range []string{"x", "y"} {
		if err := os.WriteFile(m.s(name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fail := syscall.EOPNOTSUPP
	var mu sync.Mutex
	m.fs.pt.mu.Lock()
	real := m.fs.pt.backingOpen
	m.fs.pt.backingOpen = func(fd int) (int32, error) {
		mu.Lock()
		defer mu.Unlock()
		if fail != 0 {
			return 0, fail
		}
		return real(fd)
	}
	m.fs.pt.mu.Unlock()

	readVia := func(name string) {
		t.Helper()
		if got, err := os.ReadFile(m.m(name)); err != nil || string(got) != name {
			t.Fatalf("read %s: %q, %v", name, got, err)
		}
	}
	held, err := unix.Open(m.m("x"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open with BACKING_OPEN failing: %v", err)
	}
	defer unix.Close(held)
	readVia("x")
	readVia("y")
	settle(t, m, c)
	if c.get("read") == 0 {
		t.Error("files whose registration failed were not read through the daemon")
	}
	const msg = "FUSE_DEV_IOC_BACKING_OPEN failed: this file, and others failing so, are served without passthrough (logged once per errno)"
	if n := m.msgs.count(msg); n != 1 {
		t.Errorf("registration failure logged %d times, want once", n)
	}
	// Registration works again, but x is still open without passthrough:
	// its next open must be an ordinary one too (a passthrough one would
	// fail with EIO), while y, closed, may switch.
	mu.Lock()
	fail = 0
	mu.Unlock()
	readVia("x")
	readVia("y")
	x, y := m.fs.lookupFile(t, m.s("x")), m.fs.lookupFile(t, m.s("y"))
	// The kernel sends RELEASE after close(2) returns.
	testutil.Eventually(t, "x's second open and y's to be released", func() bool {
		m.fs.pt.mu.Lock()
		defer m.fs.pt.mu.Unlock()
		xio := m.fs.pt.inodes[x]
		return xio != nil && xio.cached == 1 && xio.pt == 0 && m.fs.pt.inodes[y] == nil
	})

	mu.Lock()
	fail = syscall.EPERM
	mu.Unlock()
	readVia("y")
	if on, why := m.fs.PassthroughState(); on || why == "" {
		t.Errorf("after EPERM: passthrough %v (%q), want off with a reason", on, why)
	}
}

// lookupFile returns the node of the regular file at SOURCE path p.
func (f *FS) lookupFile(t *testing.T, p string) *File {
	t.Helper()
	n, ok := f.lookupNode(keyAt(t, p)).(*File)
	if !ok {
		t.Fatalf("no file node for %s", p)
	}
	return n
}

// TestPTDataLocksWithoutPassthrough runs the data-file lock tests and the
// POSIX suite again with passthrough off (the other tests run with it on,
// newPTMountAt), so that both modes keep locks on data files working.
func TestPTDataLocksWithoutPassthrough(t *testing.T) {
	if !ptTestPassthrough.Load() {
		t.Skip("LOCKFS_TEST_PASSTHROUGH=off: every test already runs without passthrough")
	}
	ptTestPassthrough.Store(false)
	defer ptTestPassthrough.Store(true)
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"FileLocksMeetLocksOnSource", TestPTFileLocksMeetLocksOnSource},
		{"GetlkNamesTheHolder", TestPTGetlkNamesTheHolder},
		{"LockReleaseRules", TestPTLockReleaseRules},
		{"LockWaitEndsOnSignal", TestPTLockWaitEndsOnSignal},
		{"SQLiteConcurrentWriters", TestPTSQLiteConcurrentWriters},
		{"CounterNeedsFlock", TestPTCounterNeedsFlock},
		{"Posix", TestPosix},
	} {
		t.Run(tc.name, tc.fn)
	}
}

// mmapPy runs a python3 script that uses a shared mapping of a file of
// the mount, with mapped(path) in scope, and fails the test unless it
// prints ok. A mapping is used from another process: a page fault of this
// one on the mount would wait for the daemon in this very process while
// holding its P, and a garbage collection the daemon starts then waits
// for that P forever.
func mmapPy(t *testing.T, script string, args ...string) {
	t.Helper()
	const prelude = "import mmap, os, sys\n" +
		"def mapped(p):\n" +
		"    fd = os.open(p, os.O_RDWR)\n" +
		"    return mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED)\n"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, fstest.Python(t), append([]string{"-c", prelude + script}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("mapping script: %v: %s", err, out)
	}
}
