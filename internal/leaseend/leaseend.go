// Package leaseend is the end of one lease of a network backend
// (gcsbackend, etcdbackend): released by the engine, or lost, once, with
// why; and whether another host is known to wait for it. The backends
// embed an End (by value: no allocation of its own) in their lease and add
// what is theirs: the check of the session's validity, the log line and
// the count of a loss, OnLost's goroutine.
package leaseend

import (
	"errors"
	"fmt"
	"sync"

	"github.com/lockfs/lockfs/lockmgr"
)

// End is the end state of one lease. Its zero value is a lease neither
// lost, released nor contended.
type End struct {
	mu sync.Mutex
	// lostc (Done) is closed once the lease is lost, contendc (Contended)
	// once another host is known to wait for it. Each is made when first
	// asked for: a host holding many locks asks for neither on most (the
	// engine is called back through OnLost), and two channels are about
	// 0.2 KiB per held lock. GUARDED_BY(mu)
	lostc, contendc chan struct{}
	// contended: another host is known to wait for the lease's claim.
	// INVARIANT: contendc, once made, is closed iff contended. GUARDED_BY(mu)
	contended bool
	// released is set once Release (or the backend's Close) began.
	// GUARDED_BY(mu)
	released bool
	// lostErr wraps lockmgr.ErrLeaseLost once the lease is lost.
	// INVARIANT: lostc, once made, is closed iff lostErr != nil. GUARDED_BY(mu)
	lostErr error
	// onLost is handed to the caller of the Lose that loses the lease.
	// GUARDED_BY(mu)
	onLost func()
}

// Done returns a channel closed when the lease is lost.
func (e *End) Done() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lostc == nil {
		e.lostc = make(chan struct{})
		if e.lostErr != nil {
			close(e.lostc)
		}
	}
	return e.lostc
}

// Contended returns a channel closed once another host is known to wait
// for a conflicting claim (lockmgr.ContendedLease).
func (e *End) Contended() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.contendc == nil {
		e.contendc = make(chan struct{})
		if e.contended {
			close(e.contendc)
		}
	}
	return e.contendc
}

// Contend marks the lease contended (closing Contended's channel), once;
// it reports whether this call did.
func (e *End) Contend() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.contended {
		return false
	}
	e.contended = true
	if e.contendc != nil {
		close(e.contendc)
	}
	return true
}

// IsContended reports whether the lease is contended.
func (e *End) IsContended() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.contended
}

// Lost returns why the lease was lost (wrapping lockmgr.ErrLeaseLost), or
// nil.
func (e *End) Lost() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lostErr
}

// Lose marks the lease on id lost because of cause (wrapped in
// lockmgr.ErrLeaseLost if it is not; Lost's error names id too), once,
// unless it was released. It returns the wrapped cause if this call lost
// the lease (nil if not), and the function given to OnLost, if any, for
// the caller to run.
func (e *End) Lose(id lockmgr.LockID, cause error) (lost error, onLost func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lostErr != nil || e.released {
		return nil, nil
	}
	if !errors.Is(cause, lockmgr.ErrLeaseLost) {
		cause = fmt.Errorf("%w: %w", lockmgr.ErrLeaseLost, cause)
	}
	e.lostErr = fmt.Errorf("%s: %w", id, cause)
	if e.lostc != nil {
		close(e.lostc)
	}
	f := e.onLost
	e.onLost = nil
	return cause, f
}

// OnLost keeps f for the Lose that loses the lease, unless it is lost
// already: then it reports true and keeps nothing. stop forgets f.
func (e *End) OnLost(f func()) (lostAlready bool, stop func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lostErr != nil {
		return true, func() {}
	}
	e.onLost = f
	return false, func() {
		e.mu.Lock()
		e.onLost = nil
		e.mu.Unlock()
	}
}

// Release marks the lease released. first is false if it already was;
// lost reports whether it had been lost before.
func (e *End) Release() (first, lost bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.released {
		return false, e.lostErr != nil
	}
	e.released = true
	return true, e.lostErr != nil
}

// Usable returns why the lease on id cannot be used: lost (Lost's error),
// or released (lockmgr.ErrNotHeld); nil if it can.
func (e *End) Usable(id lockmgr.LockID) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.lostErr != nil:
		return e.lostErr
	case e.released:
		return fmt.Errorf("%s: %w", id, lockmgr.ErrNotHeld)
	}
	return nil
}

// State returns why the lease was lost, and whether it was released.
func (e *End) State() (lost error, released bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lostErr, e.released
}
