package integration

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"golang.org/x/sys/unix"
	"pgregory.net/rapid"
)

// TestDataOpsMatchSource drives one file through a mount with random
// sequences of the calls programs make on data (pwrite, pread, O_APPEND
// writes, ftruncate, fallocate in its modes, stores through a shared
// mapping, sendfile, fsync, SEEK_DATA/SEEK_HOLE, reopening), interleaved
// with changes made by "another program" (a pwrite or ftruncate directly in
// SOURCE, or through a second mount of it), and makes every call the same
// way on a reference file of the same file system used directly. After
// every call the results must agree: bytes, counts, errno, sizes, offsets.
// It runs in every data mode (docs/DATA-PATH.md).
//
// What it compares follows the documented guarantee: through passthrough,
// reads see another program's change at once; without it, only after the
// file is reopened or a lock on it is granted (close-to-open and lock
// coherence). Sizes from fstat(2) through the mount are compared once
// another program's change has been followed by a reopen or a lock, in
// both modes (attributes are kept for up to 1 s otherwise).
//
// Control: the same kind of sequence on a daemon that keeps the kernel's
// cache regardless (LOCKFS_TEST_KEEP_CACHE=1) must diverge: a read after a
// lock shows the bytes from before another program's change.
func TestDataOpsMatchSource(t *testing.T) {
	for _, dm := range dataModes {
		t.Run(dm.name, func(t *testing.T) {
			a, b := twoMounts(t, dm.args)
			t.Run("random", func(t *testing.T) {
				n := 0
				rapid.Check(t, func(rt *rapid.T) {
					n++
					r := newDataRig(rt, a, b, fmt.Sprintf("ops-%d", n), dm.name == "passthrough")
					defer r.close()
					rt.Repeat(map[string]func(*rapid.T){
						"pwrite":         r.pwrite,
						"append":         r.append,
						"pread":          r.pread,
						"sendfile":       r.sendfile,
						"ftruncate":      r.ftruncate,
						"fallocate":      r.fallocate,
						"mmap store":     r.mmapStore,
						"fsync":          r.fsync,
						"seek":           r.seek,
						"fstat":          r.fstat,
						"reopen":         r.reopen,
						"lock":           r.lock,
						"other write":    r.otherWrite,
						"other truncate": r.otherTruncate,
						"":               r.check,
					})
					r.final(rt)
				})
			})
			t.Run("found", func(t *testing.T) { replayFound(t, a, b) })
		})
	}
	t.Run("control", func(t *testing.T) {
		a, b := twoMounts(t, controlArgs, keepCacheEnv)
		r := newDataRig(t, a, b, "control", false)
		defer r.close()
		r.write(t, 0, 0, 8192, 1) // through the mount, so the kernel caches it
		r.read(t, 0, 0, 8192)
		r.other(t, false, 0, 4096, 2) // in SOURCE, then a lock below
		r.lockFd(t, 0)
		if err := r.compareRead(0, 0, 8192); err == nil {
			t.Fatal("a daemon that keeps the cache regardless read SOURCE's change after a lock: the check cannot fail")
		} else {
			t.Logf("control diverges as it must: %v", err)
		}
	})
}

// replayFound replays the shortest sequences that the random runs found
// diverging before the fixes they led to (fs/cache.go raiseSize and the
// end-of-file check of written-back pages in fs/file.go Write). Each one
// fails with its fix taken out, by hand: a rapid run may not hit them
// within its checks.
func replayFound(t *testing.T, a, b *Mount) {
	for _, c := range []struct {
		name string
		run  func(*testing.T, *dataRig)
	}{
		// The file grew in SOURCE; after a lock, sendfile(2) stopped at
		// the kernel's old size.
		{"GrewThenLockThenSendfile", func(t *testing.T, r *dataRig) {
			r.other(t, false, 0, 1, 1)
			r.lockFd(t, 0)
			r.sendfileAt(t, 0, 0, 1)
		}},
		// The file grew in SOURCE; after a reopen, a store through a
		// mapping past the kernel's old size was dropped at write-back.
		{"GrewThenReopenThenStore", func(t *testing.T, r *dataRig) {
			r.write(t, 0, 0, 1, 1)
			r.other(t, false, 0, 2, 2)
			r.reopenFd(t, 0)
			r.mmapStoreAt(t, 0, 1, 1, 3)
			r.sourceIsRef(t)
		}},
		// The file shrank in SOURCE under a mapping; a store into the
		// bytes it kept was written back as a whole page and grew the
		// file again (as after a lock, found as such: there a read that
		// comes back short may lower the kernel's size first).
		{"ShrankUnderAMapping", func(t *testing.T, r *dataRig) {
			r.write(t, 0, 0, 8192, 1)
			m, err := unix.Mmap(r.mnt[0], 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(m)
			_ = m[0] // the page is cached and mapped
			r.otherTruncateTo(t, 15)
			if fault := storeAt(m, 3, pattern(4, 10)); fault != nil {
				t.Fatalf("store: %v", fault)
			}
			if err := unix.Msync(m, unix.MS_SYNC); err != nil {
				t.Fatal(err)
			}
			if _, err := unix.Pwrite(r.ref[0], pattern(4, 10), 3); err != nil {
				t.Fatal(err)
			}
			r.sourceIsRef(t)
		}},
		// A read came back short after a shrink and lowered the kernel's
		// size below what it had been told; the file then grew, and after
		// a lock a mapping of the new bytes faulted.
		{"ShortReadThenGrewThenStore", func(t *testing.T, r *dataRig) {
			r.other(t, false, 13809, 25, 1)
			r.sizes(t, 0)
			r.otherTruncateTo(t, 0)
			r.reopenFd(t, 0)
			unix.Pread(r.mnt[0], make([]byte, 6), 243)
			r.otherTruncateTo(t, 13834)
			r.lockFd(t, 0)
			r.mmapStoreAt(t, 8192, 8254, 1, 5)
			r.sourceIsRef(t)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newDataRig(t, a, b, "found-"+c.name, false)
			defer r.close()
			c.run(t, r)
		})
	}
}

// mustDiffer is the end of a control: the comparison of a random test
// must have found diff, a difference from what unseen names.
func mustDiffer(t *testing.T, diff, unseen string) {
	t.Helper()
	if diff == "" {
		t.Fatalf("%s went unseen: the comparison cannot fail", unseen)
	}
	t.Logf("control differs as it must: %s", diff)
}

// rigT is the part of *testing.T and *rapid.T that the rigs need.
type rigT interface {
	Helper()
	Fatalf(format string, args ...any)
}

// callTrace is the calls a random sequence has made (the rigs of the
// random tests embed it), for the message of a divergence.
type callTrace struct{ calls []string }

// fail reports a divergence with the last calls made.
func (c *callTrace) fail(t rigT, format string, a ...any) {
	t.Helper()
	tail := c.calls
	if len(tail) > 40 {
		tail = tail[len(tail)-40:]
	}
	t.Fatalf("%s\ncalls (last %d): %q", fmt.Sprintf(format, a...), len(tail), tail)
}

// dataRig is one file used through the mount (mnt, three descriptors:
// two O_RDWR, one O_RDWR|O_APPEND) and its reference (ref, the same three)
// used directly, plus the ways another program reaches the mount's file:
// directly in SOURCE and through the second mount.
type dataRig struct {
	mntPath, refPath, srcPath, otherMntPath string
	mnt, ref                                [3]int
	passthrough                             bool
	// dataStale: another program changed the file since the last reopen
	// or lock through the mount, and the mount may still show cached
	// pages (without passthrough). attrStale: the same, for sizes.
	dataStale, attrStale bool
	// sizeHigh: the file shrank elsewhere, and the mount's kernel may
	// still have the larger size: FUSE can only raise it (raiseSize in
	// fs/cache.go), so it stays until the kernel stats the file (fstat
	// through the mount). Until then reads may return zeros up to the
	// old size, and an O_APPEND write is cached at the old end
	// (docs/DATA-PATH.md).
	sizeHigh bool
	callTrace
}

const (
	rigMaxOff = 3 << 18 // offsets up to 768 KiB
	rigMaxLen = 200 << 10
)

func newDataRig(t rigT, a, b *Mount, name string, passthrough bool) *dataRig {
	t.Helper()
	r := &dataRig{
		mntPath:      a.path("c", name),
		srcPath:      a.srcPath("c", name),
		otherMntPath: b.path("c", name),
		refPath:      filepath.Join(filepath.Dir(a.Src), "ref-"+name),
		passthrough:  passthrough,
	}
	for i := range 3 {
		flags := unix.O_RDWR | unix.O_CREAT | unix.O_CLOEXEC
		if i == 2 {
			flags |= unix.O_APPEND
		}
		var err error
		if r.mnt[i], err = unix.Open(r.mntPath, flags, 0o644); err != nil {
			t.Fatalf("open %s: %v", r.mntPath, err)
		}
		if r.ref[i], err = unix.Open(r.refPath, flags, 0o644); err != nil {
			t.Fatalf("open %s: %v", r.refPath, err)
		}
	}
	return r
}

func (r *dataRig) close() {
	for i := range 3 {
		unix.Close(r.mnt[i])
		unix.Close(r.ref[i])
	}
	os.Remove(r.refPath)
	os.Remove(r.srcPath)
}

// pattern is n bytes that say which call wrote them.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*31 + i*7 + i>>9)
	}
	return b
}

func (r *dataRig) note(format string, a ...any) {
	r.calls = append(r.calls, fmt.Sprintf(format, a...))
}

// same fails unless both sides' results agree.
func (r *dataRig) same(t rigT, what string, nm, nr int, em, er error) {
	t.Helper()
	if nm != nr || !errors.Is(em, er) && !errors.Is(er, em) {
		r.fail(t, "%s: through the mount %d, %v; directly %d, %v", what, nm, em, nr, er)
	}
}

func drawFd(t *rapid.T) int    { return rapid.IntRange(0, 1).Draw(t, "fd") }
func drawOff(t *rapid.T) int64 { return int64(rapid.IntRange(0, rigMaxOff).Draw(t, "off")) }
func drawLen(t *rapid.T) int   { return rapid.IntRange(1, rigMaxLen).Draw(t, "len") }

func (r *dataRig) write(t rigT, fd int, off int64, n, seed int) {
	t.Helper()
	p := pattern(seed, n)
	r.note("pwrite fd%d %d+%d", fd, off, n)
	nm, em := unix.Pwrite(r.mnt[fd], p, off)
	nr, er := unix.Pwrite(r.ref[fd], p, off)
	r.same(t, "pwrite", nm, nr, em, er)
}

func (r *dataRig) pwrite(t *rapid.T) {
	r.write(t, drawFd(t), drawOff(t), drawLen(t), rapid.IntRange(1, 250).Draw(t, "seed"))
}

func (r *dataRig) append(t *rapid.T) {
	if r.sizeHigh {
		return
	}
	n, seed := drawLen(t), rapid.IntRange(1, 250).Draw(t, "seed")
	p := pattern(seed, n)
	r.note("append %d", n)
	nm, em := unix.Write(r.mnt[2], p)
	nr, er := unix.Write(r.ref[2], p)
	r.same(t, "O_APPEND write", nm, nr, em, er)
}

// compareRead reads n bytes at off through descriptor fd on both sides.
func (r *dataRig) compareRead(fd int, off int64, n int) error {
	bm, br := make([]byte, n), make([]byte, n)
	nm, em := unix.Pread(r.mnt[fd], bm, off)
	nr, er := unix.Pread(r.ref[fd], br, off)
	if nm != nr || !errors.Is(em, er) && !errors.Is(er, em) {
		return fmt.Errorf("pread fd%d %d+%d: through the mount %d, %v; directly %d, %v", fd, off, n, nm, em, nr, er)
	}
	if nm > 0 && !bytes.Equal(bm[:nm], br[:nr]) {
		i := 0
		for bm[i] == br[i] {
			i++
		}
		return fmt.Errorf("pread fd%d %d+%d: %d bytes, first difference at offset %d: %#x through the mount, %#x directly", fd, off, n, nm, off+int64(i), bm[i], br[i])
	}
	return nil
}

func (r *dataRig) read(t rigT, fd int, off int64, n int) {
	t.Helper()
	r.note("pread fd%d %d+%d", fd, off, n)
	if r.dataStale || r.sizeHigh {
		return // not promised until a reopen or a lock (and a stat)
	}
	if err := r.compareRead(fd, off, n); err != nil {
		r.fail(t, "%v", err)
	}
}

func (r *dataRig) pread(t *rapid.T) { r.read(t, drawFd(t), drawOff(t), drawLen(t)) }

// sendfile reads through splice(2): from the descriptor into a pipe.
func (r *dataRig) sendfile(t *rapid.T) {
	r.sendfileAt(t, drawFd(t), drawOff(t), rapid.IntRange(1, 60<<10).Draw(t, "len"))
}

func (r *dataRig) sendfileAt(t rigT, fd int, off int64, n int) {
	t.Helper()
	r.note("sendfile fd%d %d+%d", fd, off, n)
	if r.dataStale || r.sizeHigh {
		return
	}
	side := func(src int) ([]byte, int, error) {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			t.Fatalf("pipe: %v", err)
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		o := off
		got, err := unix.Sendfile(p[1], src, &o, n)
		buf := make([]byte, 64<<10)
		k := 0
		if got > 0 {
			k, _ = unix.Read(p[0], buf)
		}
		return buf[:k], got, err
	}
	bm, nm, em := side(r.mnt[fd])
	br, nr, er := side(r.ref[fd])
	r.same(t, "sendfile", nm, nr, em, er)
	if !bytes.Equal(bm, br) {
		r.fail(t, "sendfile fd%d %d+%d: %d bytes through the mount differ from the %d read directly", fd, off, n, len(bm), len(br))
	}
}

func (r *dataRig) ftruncate(t *rapid.T) {
	fd, size := drawFd(t), int64(rapid.IntRange(0, rigMaxOff+rigMaxLen).Draw(t, "size"))
	r.note("ftruncate fd%d %d", fd, size)
	em, er := unix.Ftruncate(r.mnt[fd], size), unix.Ftruncate(r.ref[fd], size)
	r.same(t, "ftruncate", 0, 0, em, er)
}

var fallocModes = []uint32{
	0,
	unix.FALLOC_FL_KEEP_SIZE,
	unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE,
	unix.FALLOC_FL_PUNCH_HOLE, // EOPNOTSUPP on both sides
	unix.FALLOC_FL_ZERO_RANGE,
	unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE,
}

func (r *dataRig) fallocate(t *rapid.T) {
	fd, mode := drawFd(t), rapid.SampledFrom(fallocModes).Draw(t, "mode")
	off, n := drawOff(t), int64(drawLen(t))
	r.note("fallocate fd%d mode %#x %d+%d", fd, mode, off, n)
	em := unix.Fallocate(r.mnt[fd], mode, off, n)
	er := unix.Fallocate(r.ref[fd], mode, off, n)
	r.same(t, "fallocate", 0, 0, em, er)
}

// mmapStore stores through a shared mapping of the mount's file, within
// the file's size, and msyncs; the reference gets the same bytes by
// pwrite. The mapping is made without an fstat through the mount first,
// so the kernel's size is the one the last reopen or lock left it.
func (r *dataRig) mmapStore(t *rapid.T) {
	if r.dataStale {
		return // a store into an old cached page would be written back
	}
	size := r.refSize(t)
	if size == 0 {
		return
	}
	page := int64(os.Getpagesize())
	start := int64(rapid.IntRange(0, int((size-1)/page)).Draw(t, "page")) * page
	at := start + rapid.Int64Range(0, size-start-1).Draw(t, "at")
	n := rapid.Int64Range(1, size-at).Draw(t, "n")
	r.mmapStoreAt(t, start, at, n, rapid.IntRange(1, 250).Draw(t, "seed"))
}

// refSize is the reference's size.
func (r *dataRig) refSize(t rigT) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(r.ref[0], &st); err != nil {
		t.Fatalf("fstat: %v", err)
	}
	return st.Size
}

// mmapStoreAt maps the mount's file from start (page-aligned) to the
// reference's end of file, stores n bytes at at, and msyncs.
func (r *dataRig) mmapStoreAt(t rigT, start, at, n int64, seed int) {
	t.Helper()
	size := r.refSize(t)
	length := size - start
	r.note("mmap store fd0 %d+%d", at, n)
	m, err := unix.Mmap(r.mnt[0], start, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		r.fail(t, "mmap %d+%d of a file of %d bytes: %v", start, length, size, err)
	}
	fault := storeAt(m, at-start, pattern(seed, int(n)))
	err = unix.Msync(m, unix.MS_SYNC)
	unix.Munmap(m)
	if fault != nil {
		var sm unix.Stat_t
		unix.Fstat(r.mnt[0], &sm)
		r.fail(t, "store at %d+%d through a mapping of %d+%d (the file has %d bytes; the mount says %d): %v", at, n, start, length, size, sm.Size, fault)
	}
	if err != nil {
		r.fail(t, "msync: %v", err)
	}
	if _, err := unix.Pwrite(r.ref[0], pattern(seed, int(n)), at); err != nil {
		t.Fatalf("pwrite: %v", err)
	}
}

// storeAt copies p into m at off, and returns the fault (SIGBUS) it
// took instead of crashing the test binary.
func storeAt(m []byte, off int64, p []byte) (fault any) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() { fault = recover() }()
	copy(m[off:], p)
	return nil
}

func (r *dataRig) fsync(t *rapid.T) {
	fd := drawFd(t)
	r.note("fsync fd%d", fd)
	r.same(t, "fsync", 0, 0, unix.Fsync(r.mnt[fd]), unix.Fsync(r.ref[fd]))
}

// seek compares SEEK_DATA and SEEK_HOLE through the mount with the same
// call on the file in SOURCE: where the holes of two files written alike
// fall depends on when their pages were written back (ext4's delayed
// allocation), so the reference would not do.
func (r *dataRig) seek(t *rapid.T) {
	fd, off := drawFd(t), drawOff(t)
	whence := rapid.SampledFrom([]int{unix.SEEK_DATA, unix.SEEK_HOLE}).Draw(t, "whence")
	r.note("lseek fd%d %d %d", fd, off, whence)
	if r.attrStale {
		return
	}
	sfd, err := unix.Open(r.srcPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		r.fail(t, "open %s: %v", r.srcPath, err)
	}
	defer unix.Close(sfd)
	om, em := unix.Seek(r.mnt[fd], off, whence)
	os, es := unix.Seek(sfd, off, whence)
	if om != os || !errors.Is(em, es) && !errors.Is(es, em) {
		r.fail(t, "lseek: through the mount %d, %v; in SOURCE %d, %v", om, em, os, es)
	}
}

func (r *dataRig) fstat(t *rapid.T) {
	fd := drawFd(t)
	r.note("fstat fd%d", fd)
	r.sizes(t, fd)
}

func (r *dataRig) sizes(t rigT, fd int) {
	t.Helper()
	var sm, sr unix.Stat_t
	em, er := unix.Fstat(r.mnt[fd], &sm), unix.Fstat(r.ref[fd], &sr)
	if r.attrStale {
		return // taken, but the mount may show the size of before
	}
	r.sizeHigh = false // the kernel has the size it showed
	if em != nil || er != nil || sm.Size != sr.Size {
		r.fail(t, "fstat fd%d: size %d (%v) through the mount, %d (%v) directly", fd, sm.Size, em, sr.Size, er)
	}
}

// reopen closes descriptor fd on both sides and opens it again: the open
// revalidates the mount's cache and attributes.
func (r *dataRig) reopen(t *rapid.T) { r.reopenFd(t, rapid.IntRange(0, 2).Draw(t, "fd")) }

func (r *dataRig) reopenFd(t rigT, fd int) {
	t.Helper()
	r.note("reopen fd%d", fd)
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if fd == 2 {
		flags |= unix.O_APPEND
	}
	unix.Close(r.mnt[fd])
	unix.Close(r.ref[fd])
	var err error
	if r.mnt[fd], err = unix.Open(r.mntPath, flags, 0); err != nil {
		r.fail(t, "reopen: %v", err)
	}
	if r.ref[fd], err = unix.Open(r.refPath, flags, 0); err != nil {
		t.Fatalf("reopen %s: %v", r.refPath, err)
	}
	r.dataStale, r.attrStale = false, false
}

// lockFd takes and drops a write record lock through descriptor fd: the
// grant revalidates the mount's cache and attributes.
func (r *dataRig) lockFd(t rigT, fd int) {
	t.Helper()
	r.note("lock fd%d", fd)
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0}
	if err := unix.FcntlFlock(uintptr(r.mnt[fd]), unix.F_SETLKW, &lk); err != nil {
		r.fail(t, "F_SETLKW: %v", err)
	}
	lk.Type = unix.F_UNLCK
	if err := unix.FcntlFlock(uintptr(r.mnt[fd]), unix.F_SETLK, &lk); err != nil {
		r.fail(t, "F_UNLCK: %v", err)
	}
	r.dataStale, r.attrStale = false, false
}

func (r *dataRig) lock(t *rapid.T) { r.lockFd(t, drawFd(t)) }

// other has another program write (truncate: resize) the file, directly
// in SOURCE or through the second mount, and the reference likewise.
func (r *dataRig) other(t rigT, viaMount bool, off int64, n, seed int) {
	t.Helper()
	path := r.srcPath
	if viaMount {
		path = r.otherMntPath
	}
	r.note("other %s: pwrite %d+%d", filepath.Base(filepath.Dir(filepath.Dir(path))), off, n)
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		r.fail(t, "open %s: %v", path, err)
	}
	defer unix.Close(fd)
	p := pattern(seed, n)
	nm, em := unix.Pwrite(fd, p, off)
	nr, er := unix.Pwrite(r.ref[0], p, off)
	r.same(t, "another program's pwrite", nm, nr, em, er)
	r.changedElsewhere()
}

func (r *dataRig) changedElsewhere() {
	r.attrStale = true
	r.dataStale = !r.passthrough
}

func (r *dataRig) otherWrite(t *rapid.T) {
	r.other(t, rapid.Bool().Draw(t, "via the second mount"), drawOff(t), drawLen(t), rapid.IntRange(1, 250).Draw(t, "seed"))
}

func (r *dataRig) otherTruncate(t *rapid.T) {
	r.otherTruncateTo(t, int64(rapid.IntRange(0, rigMaxOff+rigMaxLen).Draw(t, "size")))
}

func (r *dataRig) otherTruncateTo(t rigT, size int64) {
	t.Helper()
	r.note("other: ftruncate %d", size)
	if err := os.Truncate(r.srcPath, size); err != nil {
		r.fail(t, "truncate in SOURCE: %v", err)
	}
	old := r.refSize(t)
	if err := unix.Ftruncate(r.ref[0], size); err != nil {
		t.Fatalf("ftruncate: %v", err)
	}
	r.sizeHigh = r.sizeHigh || size < old
	r.changedElsewhere()
}

// check runs after every call: the file in SOURCE is the reference.
func (r *dataRig) check(t *rapid.T) { r.sourceIsRef(t) }

func (r *dataRig) sourceIsRef(t rigT) {
	t.Helper()
	want, err := os.ReadFile(r.refPath)
	if err != nil {
		t.Fatalf("read %s: %v", r.refPath, err)
	}
	got, err := os.ReadFile(r.srcPath)
	if err != nil {
		r.fail(t, "read %s: %v", r.srcPath, err)
	}
	if !bytes.Equal(got, want) {
		r.fail(t, "SOURCE holds %d bytes (%s), the reference %d", len(got), firstDiff(got, want), len(want))
	}
}

// final: a fresh open through each mount reads what the reference holds,
// and the sizes agree.
func (r *dataRig) final(t *rapid.T) {
	want, err := os.ReadFile(r.refPath)
	if err != nil {
		t.Fatalf("read %s: %v", r.refPath, err)
	}
	for _, p := range []string{r.mntPath, r.otherMntPath} {
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) {
			r.fail(t, "a fresh open of %s reads %d bytes (%v, %s), the reference holds %d", p, len(got), err, firstDiff(got, want), len(want))
		}
	}
	r.dataStale, r.attrStale = false, false // the open revalidated
	r.sizes(t, 0)
}

func firstDiff(a, b []byte) string {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return fmt.Sprintf("first difference at %d", i)
		}
	}
	if len(a) != len(b) {
		return fmt.Sprintf("equal up to %d", min(len(a), len(b)))
	}
	return "equal"
}
