package integration

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"pgregory.net/rapid"
)

// TestRecordLocksMatchSource drives byte-range locks on one file through
// two mounts of one SOURCE with random sequences of F_OFD_SETLK,
// F_OFD_GETLK, F_SETLK and F_GETLK (read, write and unlock, over random
// ranges, to end of file included) and closes, and makes the same calls on
// a file used directly: every result must agree (granted or EAGAIN, a
// conflict reported or not). The owners are three open file descriptions
// (OFD locks: two through the first mount, one through the second) and
// this process (POSIX locks, through the first mount's first descriptor),
// so that conversions, splits and merges of one owner's ranges, conflicts
// between owners of both kinds across the two mounts, and the release
// rules meet: closing a descriptor ends its OFD locks and every POSIX lock
// of the process on the file (docs/PROTOCOL.md §12). After a close, and
// at the end of every sequence, the whole lock table is compared byte by
// byte through F_OFD_GETLK from a descriptor that holds nothing.
//
// Control: the same comparison against a reference on which the second
// owner's lock was never taken must find a difference.
func TestRecordLocksMatchSource(t *testing.T) {
	for _, dm := range dataModes {
		t.Run(dm.name, func(t *testing.T) {
			a, b := twoMounts(t, dm.args)
			n := 0
			rapid.Check(t, func(rt *rapid.T) {
				n++
				r := newLockRig(rt, a, b, fmt.Sprintf("locks-%d", n))
				defer r.close()
				rt.Repeat(map[string]func(*rapid.T){
					"setlk": r.setlk,
					"getlk": r.getlk,
					"close": r.reopen,
				})
				r.compareTable(rt)
			})
		})
	}
	t.Run("control", func(t *testing.T) {
		a, b := twoMounts(t, nil)
		r := newLockRig(t, a, b, "control")
		defer r.close()
		r.lock(t, 0, unix.F_WRLCK, 10, 5)
		// The second owner's lock, through the second mount only.
		lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: 0, Start: 40, Len: 3}
		if err := unix.FcntlFlock(uintptr(r.mnt[2]), unix.F_OFD_SETLK, &lk); err != nil {
			t.Fatal(err)
		}
		mustDiffer(t, r.tableDiff(), "a lock taken only through the mount")
	})
}

// lockRig is one file locked through the mounts (mnt) and its reference
// used directly (ref). Descriptors 0 and 1 are through the first mount (or
// on the reference), 2 through the second; probe holds no lock.
type lockRig struct {
	mntPath, otherPath, refPath string
	mnt, ref                    [3]int
	probeMnt, probeRef          int
	callTrace
}

// lockOwners: OFD locks of descriptors 0, 1, 2, and POSIX locks of this
// process (owner 3, set through descriptor 0).
const lockOwners = 4

// lockSpan is how far the random ranges reach (and the table is compared).
const lockSpan = 64

func newLockRig(t rigT, a, b *Mount, name string) *lockRig {
	t.Helper()
	r := &lockRig{
		mntPath:   a.path("c", name),
		otherPath: b.path("c", name),
		refPath:   filepath.Join(filepath.Dir(a.Src), "ref-"+name),
	}
	open := func(p string) int {
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatalf("open %s: %v", p, err)
		}
		return fd
	}
	for i := range 3 {
		p := r.mntPath
		if i == 2 {
			p = r.otherPath
		}
		r.mnt[i] = open(p)
		r.ref[i] = open(r.refPath)
	}
	r.probeMnt, r.probeRef = open(r.mntPath), open(r.refPath)
	return r
}

func (r *lockRig) close() {
	for i := range 3 {
		unix.Close(r.mnt[i])
		unix.Close(r.ref[i])
	}
	unix.Close(r.probeMnt)
	unix.Close(r.probeRef)
	unix.Unlink(r.refPath)
	unix.Unlink(r.mntPath)
}

// cmdFd is the fcntl command and descriptor of owner o's calls.
func (r *lockRig) cmdFd(o int, set bool, mount bool) (int, int) {
	fds := r.ref
	if mount {
		fds = r.mnt
	}
	if o == 3 {
		if set {
			return unix.F_SETLK, fds[0]
		}
		return unix.F_GETLK, fds[0]
	}
	if set {
		return unix.F_OFD_SETLK, fds[o]
	}
	return unix.F_OFD_GETLK, fds[o]
}

var lockTypes = map[int16]string{unix.F_RDLCK: "read", unix.F_WRLCK: "write", unix.F_UNLCK: "unlock"}

// lock sets (or unlocks) owner o's lock of type typ on [start, start+n)
// (n 0: to end of file) on both sides; the results must agree.
func (r *lockRig) lock(t rigT, o int, typ int16, start, n int64) {
	t.Helper()
	r.calls = append(r.calls, fmt.Sprintf("owner %d %s %d+%d", o, lockTypes[typ], start, n))
	do := func(mount bool) error {
		cmd, fd := r.cmdFd(o, true, mount)
		lk := unix.Flock_t{Type: typ, Whence: 0, Start: start, Len: n}
		return unix.FcntlFlock(uintptr(fd), cmd, &lk)
	}
	em, er := do(true), do(false)
	if !errors.Is(em, er) && !errors.Is(er, em) {
		r.fail(t, "owner %d %s %d+%d: through the mounts %v, directly %v", o, lockTypes[typ], start, n, em, er)
	}
}

func drawRange(t *rapid.T) (int64, int64) {
	start := rapid.Int64Range(0, lockSpan-1).Draw(t, "start")
	n := rapid.Int64Range(0, lockSpan-start).Draw(t, "len") // 0: to end of file
	return start, n
}

func (r *lockRig) setlk(t *rapid.T) {
	o := rapid.IntRange(0, lockOwners-1).Draw(t, "owner")
	typ := rapid.SampledFrom([]int16{unix.F_RDLCK, unix.F_WRLCK, unix.F_UNLCK}).Draw(t, "type")
	start, n := drawRange(t)
	r.lock(t, o, typ, start, n)
}

// conflict asks, as owner o (or the probe, o -1) on one side, whether a
// lock of type typ on [start, start+n) would conflict.
func (r *lockRig) conflict(o int, mount bool, typ int16, start, n int64) (bool, error) {
	var cmd, fd int
	switch {
	case o >= 0:
		cmd, fd = r.cmdFd(o, false, mount)
	case mount:
		cmd, fd = unix.F_OFD_GETLK, r.probeMnt
	default:
		cmd, fd = unix.F_OFD_GETLK, r.probeRef
	}
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: start, Len: n}
	if err := unix.FcntlFlock(uintptr(fd), cmd, &lk); err != nil {
		return false, err
	}
	return lk.Type != unix.F_UNLCK, nil
}

func (r *lockRig) getlk(t *rapid.T) {
	o := rapid.IntRange(0, lockOwners-1).Draw(t, "owner")
	typ := rapid.SampledFrom([]int16{unix.F_RDLCK, unix.F_WRLCK}).Draw(t, "type")
	start, n := drawRange(t)
	r.calls = append(r.calls, fmt.Sprintf("owner %d getlk %s %d+%d", o, lockTypes[typ], start, n))
	cm, em := r.conflict(o, true, typ, start, n)
	cr, er := r.conflict(o, false, typ, start, n)
	if cm != cr || !errors.Is(em, er) && !errors.Is(er, em) {
		r.fail(t, "owner %d getlk %s %d+%d: conflict %v (%v) through the mounts, %v (%v) directly", o, lockTypes[typ], start, n, cm, em, cr, er)
	}
}

// reopen closes descriptor i on both sides and opens it again: its OFD
// locks end, and so do this process's POSIX locks on the file (for the
// first mount's descriptors). The kernel
// tells the daemon of the OFD locks' end asynchronously (RELEASE,
// docs/FUSE-NOTES.md), so the table is compared until it agrees.
func (r *lockRig) reopen(t *rapid.T) {
	i := rapid.IntRange(0, 2).Draw(t, "fd")
	r.calls = append(r.calls, fmt.Sprintf("close fd%d", i))
	p := r.mntPath
	if i == 2 {
		p = r.otherPath
	}
	unix.Close(r.mnt[i])
	var err error
	if r.mnt[i], err = unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
		r.fail(t, "reopen %s: %v", p, err)
	}
	if i == 2 {
		// The second mount's file is another file to the kernel (as on
		// another host): closing it ends its own OFD locks, not this
		// process's POSIX locks taken through the first mount. On the
		// reference, where all three are one file, the same effect is
		// an unlock of the whole file by that descriptor.
		lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: 0}
		if err := unix.FcntlFlock(uintptr(r.ref[2]), unix.F_OFD_SETLK, &lk); err != nil {
			t.Fatalf("unlock: %v", err)
		}
	} else {
		unix.Close(r.ref[i])
		if r.ref[i], err = unix.Open(r.refPath, unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			t.Fatalf("reopen %s: %v", r.refPath, err)
		}
	}
	r.compareTable(t)
}

// tableDiff compares, byte by byte over the span and past it, whether a
// read and a write lock would conflict, from a descriptor holding nothing;
// "" if both sides agree.
func (r *lockRig) tableDiff() string {
	for _, typ := range []int16{unix.F_RDLCK, unix.F_WRLCK} {
		for p := int64(0); p <= lockSpan; p++ {
			n := int64(1)
			if p == lockSpan {
				n = 0 // the rest of the file
			}
			cm, em := r.conflict(-1, true, typ, p, n)
			cr, er := r.conflict(-1, false, typ, p, n)
			if cm != cr || em != nil || er != nil {
				return fmt.Sprintf("a %s lock at %d would conflict through the mounts: %v (%v); directly: %v (%v)", lockTypes[typ], p, cm, em, cr, er)
			}
		}
	}
	return ""
}

// compareTable waits up to 10 s for the tables to agree.
func (r *lockRig) compareTable(t rigT) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		diff := r.tableDiff()
		if diff == "" {
			return
		}
		if time.Now().After(deadline) {
			r.fail(t, "after 10 s, %s", diff)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
