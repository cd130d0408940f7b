package filelock

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/internal/resolve"
)

// Locks on ordinary files.
//
// The mount asks the kernel for every flock(2) and fcntl(2) lock (the
// control files need that), so the locks of regular files arrive here too.
// They are applied to the backing file in the host kernel, so that locks
// taken through the mount and locks taken on SOURCE directly exclude each
// other as they would on one local file system:
//
//   - flock: flock(2) on the handle's own backing descriptor. One FUSE
//     handle is one open file description of the caller, so the lock
//     belongs to the right description and ends when it is released.
//   - POSIX record locks and OFD locks (both arrive with LockFlags 0, an
//     owner per process for the first, per open file description for the
//     second): per (inode, owner), a dedicated backing open file
//     description, on which the range is set as an OFD lock. OFD locks on a
//     description of its own give that owner exactly POSIX semantics
//     (ranges split and merge, a later lock converts an earlier one, the
//     owner never conflicts with itself), and the daemon's own close(2)s
//     never drop them, as they would drop classic POSIX locks of the daemon.
//     The description is closed, dropping the owner's locks, at Flush with
//     that owner (POSIX: any close(2) by the process ends its locks on the
//     file) and at Release of a handle it locked through (OFD locks end
//     with their description; every process that shared it has flushed by
//     then, so no POSIX owner still needs it).
//   - Waits (F_SETLKW, flock without LOCK_NB) never block a thread in the
//     kernel, where a signal could not reach it (Go installs its handlers
//     with SA_RESTART): the request polls non-blocking attempts with
//     jittered exponential backoff from 1 ms to 50 ms until it is granted
//     or its context ends (an interrupt), and then answers EINTR. A waiter
//     therefore gets the lock up to 50 ms after it is free.
//   - Deadlocks: a byte-range wait (F_SETLKW) that would close a cycle of
//     waits among this mount's lock owners fails with EDEADLK, as the
//     kernel's does (deadlock.go). flock(2) waits, like the
//     kernel's, have no deadlock detection.

// Config is what the locks of one mount need of it.
type Config struct {
	// TakeFd counts a new descriptor, one that carries locks, for uid for
	// op on path, or fails if uid is at its cap. Required.
	TakeFd func(op string, path func() string, uid uint32) error
	// GiveFd gives back what TakeFd counted. Required.
	GiveFd func(uid uint32)
	// Fail logs a failed backing operation and returns the errno to
	// answer with. Required.
	Fail func(op, path string, err error) error
}

// Table holds the locks of ordinary files of one mount: per backing inode
// and lock owner, the backing descriptor that carries that owner's
// byte-range locks, and the wait-for graph of byte-range lock waits.
//
// LOCK ORDERING: Handle.mu → ownersMu; waits.mu is taken before ownersMu
// and fileLockOwner.mu, and held across a carrier's non-blocking fcntl or
// close and a deadlock check's reads of /proc/self/fdinfo (deadlock.go).
// No other lock is held across a syscall, and none while a File is called
// (but for File.Inode, which reads a constant).
type Table struct {
	// Dependencies
	cfg Config

	// Mutable state

	// ownersMu guards owners.
	ownersMu sync.Mutex
	// owners holds, per backing inode and POSIX lock owner, the backing
	// descriptor that carries that owner's byte-range locks.
	// GUARDED_BY(ownersMu)
	owners map[ownerKey]*fileLockOwner

	// waits is the wait-for graph of byte-range lock waits, for
	// deadlock detection (deadlock.go).
	waits rangeWaits
}

// New returns the (empty) lock table of a mount.
func New(cfg Config) *Table {
	return &Table{cfg: cfg, owners: make(map[ownerKey]*fileLockOwner)}
}

// Close closes every carrier, dropping the locks it carries. Call it after
// the mount has been served.
func (t *Table) Close() {
	t.ownersMu.Lock()
	owners := t.owners
	t.owners = make(map[ownerKey]*fileLockOwner)
	t.ownersMu.Unlock()
	for _, o := range owners {
		o.close()
	}
}

// ownerKey names one byte-range lock owner's locks on one backing inode.
type ownerKey struct {
	inode Inode
	owner fuse.LockOwner
}

// fileLockOwner is the backing open file description that carries one
// owner's byte-range locks on one inode.
type fileLockOwner struct {
	// Dependencies
	give func(uid uint32) // Config.GiveFd

	// Constant data
	key ownerKey
	// uid is the user whose handle the descriptor is counted for
	// (Config.TakeFd): it holds a descriptor of the daemon as a handle does.
	uid uint32

	// Mutable state
	// pid is the process that last locked through this owner, reported
	// to F_GETLK callers that conflict with it.
	pid atomic.Int32
	// mu is held shared while fd is used, exclusively to close it.
	mu sync.RWMutex
	// fd is the backing descriptor; -1 once closed. GUARDED_BY(mu)
	fd int
}

// close closes the owner's descriptor, dropping its locks.
func (o *fileLockOwner) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fd >= 0 {
		_ = unix.Close(o.fd)
		o.fd = -1
		o.give(o.uid)
	}
}

// do calls fn with the owner's descriptor, or returns false if it is closed.
func (o *fileLockOwner) do(fn func(fd int) error) (bool, error) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if o.fd < 0 {
		return false, nil
	}
	return true, fn(o.fd)
}

// ownerFor returns the carrier of owner's locks on h's inode, opening one
// from h's descriptor if there is none, and remembers that owner locked
// through h.
func (t *Table) ownerFor(h File, owner fuse.LockOwner) (*fileLockOwner, error) {
	key := ownerKey{inode: h.Inode(), owner: owner}
	t.ownersMu.Lock()
	o := t.owners[key]
	t.ownersMu.Unlock()
	if o == nil {
		// A new carrier holds a descriptor: counted for the handle's
		// user, who gets ENOLCK (no locks available) at the cap.
		uid := h.UID()
		if err := t.cfg.TakeFd("lock", h.Path, uid); err != nil {
			return nil, syscall.ENOLCK
		}
		var fd int
		err := h.UseFd(true, func(pfd int) (err error) {
			fd, err = openLockFd(pfd)
			return err
		})
		if err != nil {
			t.cfg.GiveFd(uid)
			return nil, err
		}
		fresh := &fileLockOwner{give: t.cfg.GiveFd, key: key, uid: uid, fd: fd}
		t.ownersMu.Lock()
		if cur := t.owners[key]; cur != nil {
			o = cur
		} else {
			t.owners[key] = fresh
			o = fresh
		}
		t.ownersMu.Unlock()
		if o != fresh {
			_ = unix.Close(fd)
			t.cfg.GiveFd(uid)
		}
	}
	hs := h.Locks()
	hs.mu.Lock()
	if hs.owners == nil {
		hs.owners = make(map[*fileLockOwner]struct{})
	}
	hs.owners[o] = struct{}{}
	hs.mu.Unlock()
	return o, nil
}

// openLockFd opens a new description of the inode behind fd, for writing
// and reading if possible (a write lock needs a writable descriptor, a read
// lock a readable one).
func openLockFd(fd int) (int, error) {
	var err error
	for _, acc := range []int{unix.O_RDWR, unix.O_RDONLY, unix.O_WRONLY} {
		var nfd int
		if nfd, err = resolve.Reopen(fd, acc|unix.O_NONBLOCK|unix.O_NOCTTY); err == nil {
			return nfd, nil
		}
	}
	return -1, err
}

// Flush closes owner's carrier on inode, if any: all its locks there end
// (POSIX: any close(2) by the process ends its locks on the file).
func (t *Table) Flush(inode Inode, owner fuse.LockOwner) {
	key := ownerKey{inode: inode, owner: owner}
	t.ownersMu.Lock()
	o := t.owners[key]
	delete(t.owners, key)
	t.ownersMu.Unlock()
	if o != nil {
		t.waits.change(owner, false, func() error { o.close(); return nil })
	}
}

// Release closes the carriers of the owners that locked through h, and of
// owner (the one the kernel names in the Release): OFD locks end with
// their open file description.
func (t *Table) Release(h File, owner fuse.LockOwner) {
	hs := h.Locks()
	hs.mu.Lock()
	owners := hs.owners
	hs.owners = nil
	hs.mu.Unlock()
	for o := range owners {
		t.ownersMu.Lock()
		if t.owners[o.key] == o {
			delete(t.owners, o.key)
		}
		t.ownersMu.Unlock()
		t.waits.change(o.key.owner, false, func() error { o.close(); return nil })
	}
	if owner != 0 {
		t.Flush(h.Inode(), owner)
	}
}

// flockT converts a FUSE lock range (inclusive end, MaxInt64 for "to the
// end") to a struct flock.
func flockT(lk fuse.FileLock, typ fuse.LockType) unix.Flock_t {
	t := unix.Flock_t{Type: int16(typ), Whence: 0, Start: int64(lk.Start)}
	if lk.End < math.MaxInt64 && lk.End >= lk.Start {
		t.Len = int64(lk.End-lk.Start) + 1
	}
	return t
}

// try makes one non-blocking attempt at a lock request; a conflict is EAGAIN.
// waiting: the attempt is one of a byte-range wait (F_SETLKW), which ends
// if it succeeds.
func (t *Table) try(h File, req *fuse.LockRequest, waiting bool) error {
	if req.LockFlags&fuse.LockFlock != 0 {
		var how int
		switch req.Lock.Type {
		case fuse.LockRead:
			how = unix.LOCK_SH | unix.LOCK_NB
		case fuse.LockWrite:
			how = unix.LOCK_EX | unix.LOCK_NB
		case fuse.LockUnlock:
			how = unix.LOCK_UN
		default:
			return syscall.EINVAL
		}
		flock := func(fd int) error { return unix.Flock(fd, how) }
		if how == unix.LOCK_UN {
			h.LockChanged(true)
			return h.FlockFd(true, flock)
		}
		err := h.FlockFd(false, flock)
		if err == nil {
			h.LockChanged(false)
		}
		return err
	}
	lk := flockT(req.Lock, req.Lock.Type)
	if req.Lock.Type == fuse.LockUnlock {
		t.ownersMu.Lock()
		o := t.owners[ownerKey{inode: h.Inode(), owner: req.LockOwner}]
		t.ownersMu.Unlock()
		if o == nil {
			return nil // nothing held
		}
		h.LockChanged(true)
		return t.waits.change(req.LockOwner, false, func() error {
			_, err := o.do(func(fd int) error { return unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk) })
			return err
		})
	}
	for {
		o, err := t.ownerFor(h, req.LockOwner)
		if err != nil {
			return err
		}
		ok := true
		err = t.waits.change(req.LockOwner, waiting, func() error {
			var err error
			ok, err = o.do(func(fd int) error { return unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk) })
			if !ok {
				return errCarrierClosed
			}
			return err
		})
		if !ok {
			continue // closed by a concurrent Flush: a fresh one
		}
		if err == nil {
			o.pid.Store(req.Lock.PID)
			h.LockChanged(false)
		}
		return err
	}
}

// lockErr maps the result of an attempt to the errno the caller sees.
func (t *Table) lockErr(h File, op string, err error) error {
	switch err {
	case nil:
		return nil
	case unix.EAGAIN, unix.EACCES:
		return syscall.EAGAIN
	}
	return t.cfg.Fail(op, h.Path(), err)
}

// Lock takes a lock on h without waiting (LOCK_NB, F_SETLK).
func (t *Table) Lock(h File, req *fuse.LockRequest) error {
	return t.lockErr(h, "lock", t.try(h, req, false))
}

// Lock backoff bounds (see the comment at the top of the file).
const (
	lockPollMin = time.Millisecond
	lockPollMax = 50 * time.Millisecond
)

// LockWait takes a lock on h, waiting until it is free or ctx ends (EINTR).
func (t *Table) LockWait(ctx context.Context, h File, req *fuse.LockWaitRequest) error {
	r := (*fuse.LockRequest)(req)
	// Jittered waits: waiters do not poll in step.
	bo := backoff.New(lockPollMin, lockPollMax)
	posix := r.LockFlags&fuse.LockFlock == 0
	if posix {
		defer t.waits.done(r.LockOwner)
	}
	for {
		err := t.try(h, r, posix)
		if err != unix.EAGAIN && err != unix.EACCES {
			return t.lockErr(h, "lockwait", err)
		}
		if posix && t.closesCycle(h, r) {
			return syscall.EDEADLK
		}
		if bo.Sleep(ctx, nil, nil) != nil {
			return syscall.EINTR
		}
	}
}

// Unlock releases a lock on h or part of a byte range.
func (t *Table) Unlock(h File, req *fuse.UnlockRequest) error {
	r := *(*fuse.LockRequest)(req)
	r.Lock.Type = fuse.LockUnlock
	return t.lockErr(h, "unlock", t.try(h, &r, false))
}
