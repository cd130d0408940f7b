package fs

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"
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
//     kernel's does (filelock_deadlock.go). flock(2) waits, like the
//     kernel's, have no deadlock detection.

// ownerKey names one byte-range lock owner's locks on one backing inode.
type ownerKey struct {
	inode inodeKey
	owner fuse.LockOwner
}

// fileLockOwner is the backing open file description that carries one
// owner's byte-range locks on one inode.
type fileLockOwner struct {
	// Dependencies
	handles *handleCap

	// Constant data
	key ownerKey
	// uid is the user whose handle the descriptor is counted for
	// (handleCap): it holds a descriptor of the daemon as a handle does.
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
		closeFd(o.fd)
		o.fd = -1
		o.handles.give(o.uid)
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
func (h *fileHandle) ownerFor(owner fuse.LockOwner) (*fileLockOwner, error) {
	f := h.n.fs
	key := ownerKey{inode: h.key, owner: owner}
	f.ownersMu.Lock()
	o := f.owners[key]
	f.ownersMu.Unlock()
	if o == nil {
		// A new carrier holds a descriptor: counted for the handle's
		// user, who gets ENOLCK (no locks available) at the cap.
		if err := f.takeHandle("lock", h.n.path, h.of.uid); err != nil {
			return nil, syscall.ENOLCK
		}
		var fd int
		err := h.useFd(true, func(pfd int) (err error) {
			fd, err = openLockFd(pfd)
			return err
		})
		if err != nil {
			f.handles.give(h.of.uid)
			return nil, err
		}
		fresh := &fileLockOwner{handles: f.handles, key: key, uid: h.of.uid, fd: fd}
		f.ownersMu.Lock()
		if cur := f.owners[key]; cur != nil {
			o = cur
		} else {
			f.owners[key] = fresh
			o = fresh
		}
		f.ownersMu.Unlock()
		if o != fresh {
			closeFd(fd)
			f.handles.give(h.of.uid)
		}
	}
	h.mu.Lock()
	if h.owners == nil {
		h.owners = make(map[*fileLockOwner]struct{})
	}
	h.owners[o] = struct{}{}
	h.mu.Unlock()
	return o, nil
}

// openLockFd opens a new description of the inode behind fd, for writing
// and reading if possible (a write lock needs a writable descriptor, a read
// lock a readable one).
func openLockFd(fd int) (int, error) {
	var err error
	for _, acc := range []int{unix.O_RDWR, unix.O_RDONLY, unix.O_WRONLY} {
		var nfd int
		if nfd, err = reopen(fd, acc|unix.O_NONBLOCK|unix.O_NOCTTY); err == nil {
			return nfd, nil
		}
	}
	return -1, err
}

// dropOwner closes owner's carrier on inode, if any: all its locks there end.
func (f *FS) dropOwner(inode inodeKey, owner fuse.LockOwner) {
	key := ownerKey{inode: inode, owner: owner}
	f.ownersMu.Lock()
	o := f.owners[key]
	delete(f.owners, key)
	f.ownersMu.Unlock()
	if o != nil {
		f.rangeWaits.change(owner, false, func() error { o.close(); return nil })
	}
}

// releaseOwners closes the carriers of the owners that locked through h,
// and of owner (the one the kernel names in the Release).
func (h *fileHandle) releaseOwners(owner fuse.LockOwner) {
	h.mu.Lock()
	owners := h.owners
	h.owners = nil
	h.mu.Unlock()
	f := h.n.fs
	for o := range owners {
		f.ownersMu.Lock()
		if f.owners[o.key] == o {
			delete(f.owners, o.key)
		}
		f.ownersMu.Unlock()
		f.rangeWaits.change(o.key.owner, false, func() error { o.close(); return nil })
	}
	if owner != 0 {
		f.dropOwner(h.key, owner)
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
func (h *fileHandle) try(req *fuse.LockRequest, waiting bool) error {
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
			h.lockCache(true)
			return h.flockFd(true, flock)
		}
		err := h.flockFd(false, flock)
		if err == nil {
			h.lockCache(false)
		}
		return err
	}
	lk := flockT(req.Lock, req.Lock.Type)
	if req.Lock.Type == fuse.LockUnlock {
		h.n.fs.ownersMu.Lock()
		o := h.n.fs.owners[ownerKey{inode: h.key, owner: req.LockOwner}]
		h.n.fs.ownersMu.Unlock()
		if o == nil {
			return nil // nothing held
		}
		h.lockCache(true)
		return h.n.fs.rangeWaits.change(req.LockOwner, false, func() error {
			_, err := o.do(func(fd int) error { return unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk) })
			return err
		})
	}
	for {
		o, err := h.ownerFor(req.LockOwner)
		if err != nil {
			return err
		}
		ok := true
		err = h.n.fs.rangeWaits.change(req.LockOwner, waiting, func() error {
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
			h.lockCache(false)
		}
		return err
	}
}

// lockErr maps the result of an attempt to the errno the caller sees.
func (h *fileHandle) lockErr(op string, err error) error {
	switch err {
	case nil:
		return nil
	case unix.EAGAIN, unix.EACCES:
		return syscall.EAGAIN
	}
	return h.n.fs.fail(op, h.n.path(), err)
}

// Lock takes a lock without waiting (LOCK_NB, F_SETLK).
func (h *fileHandle) Lock(ctx context.Context, req *fuse.LockRequest) error {
	return h.lockErr("lock", h.try(req, false))
}

// Lock backoff bounds (see the comment at the top of the file).
const (
	lockPollMin = time.Millisecond
	lockPollMax = 50 * time.Millisecond
)

// LockWait takes a lock, waiting until it is free or ctx ends (EINTR).
func (h *fileHandle) LockWait(ctx context.Context, req *fuse.LockWaitRequest) error {
	r := (*fuse.LockRequest)(req)
	delay := lockPollMin
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	posix := r.LockFlags&fuse.LockFlock == 0
	if posix {
		defer h.n.fs.rangeWaits.done(r.LockOwner)
	}
	for {
		err := h.try(r, posix)
		if err != unix.EAGAIN && err != unix.EACCES {
			return h.lockErr("lockwait", err)
		}
		if posix && h.closesCycle(r) {
			return syscall.EDEADLK
		}
		// Jitter in [delay/2, delay): waiters do not poll in step.
		d := delay/2 + rand.N(delay/2+1)
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return syscall.EINTR
		case <-timer.C:
		}
		if delay *= 2; delay > lockPollMax {
			delay = lockPollMax
		}
	}
}

// Unlock releases a lock or part of a byte range.
func (h *fileHandle) Unlock(ctx context.Context, req *fuse.UnlockRequest) error {
	r := *(*fuse.LockRequest)(req)
	r.Lock.Type = fuse.LockUnlock
	return h.lockErr("unlock", h.try(&r, false))
}
