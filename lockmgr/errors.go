package lockmgr

import "errors"

// Sentinel errors. The FUSE layer maps each to one errno, in one place.
var (
	// ErrWouldBlock: the lock is held in a conflicting mode and the request
	// did not ask to wait (EWOULDBLOCK).
	ErrWouldBlock = errors.New("lock is held in a conflicting mode")
	// ErrDeadlock: waiting would close a cycle of waits, or a process whose
	// lineage holds a usage lock asked for a lock it does not hold (EDEADLK).
	ErrDeadlock = errors.New("resource deadlock avoided")
	// ErrInvalid: the request is malformed, e.g. shared on a usage lock (EINVAL).
	ErrInvalid = errors.New("invalid lock request")
	// ErrLeaseLost: the backend can no longer vouch for the host's claim on
	// this lock, or an operator broke it (EIO).
	ErrLeaseLost = errors.New("lock lease lost")
	// ErrUnavailable: the backend could not be reached within the wait (ENOLCK).
	ErrUnavailable = errors.New("lock backend unavailable")
	// ErrClosed: the engine is shutting down and takes no new locks (ENOLCK).
	ErrClosed = errors.New("lock engine closed")
	// ErrNotHeld: a release named a lock the owner does not hold. Unlocking
	// an unheld lock succeeds in the kernel; callers may ignore it.
	ErrNotHeld = errors.New("lock not held")
)
