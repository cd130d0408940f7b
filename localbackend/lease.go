package localbackend

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/lockmgr"
)

// lease is a claim held as a kernel flock by one open file description.
//
// The engine calls one of Convert, NextToken and Release at a time per lock;
// Mode, Done and Err may be called at any time.
type lease struct {
	// Dependencies
	b *Backend

	// Constant data
	id  lockmgr.LockID
	rel string // the backing file, relative to SOURCE
	// backing's file is the open file description holding the flock.
	backing
	// keptSince is when the claim was first kept (keep.go) if it reuses a
	// kept one, else zero: reuses do not extend keepFor.
	keptSince time.Time

	// Mutable state
	mu sync.Mutex
	// mode is the flock held; 0 once lost or released. GUARDED_BY(mu)
	mode lockmgr.Mode
	// lostErr wraps lockmgr.ErrLeaseLost once the claim was lost. GUARDED_BY(mu)
	lostErr error
	// lostc is nil until the loss, then a closed channel. GUARDED_BY(mu)
	// INVARIANT: lostc != nil iff lostErr != nil.
	lostc chan struct{}
	// released is set once the descriptor is closed. GUARDED_BY(mu)
	released bool

	// contended is Contended's channel, made at the first call; wanted
	// is set when it is closed: a process outside this backend waits for
	// the file. lockKey names the file as /proc/locks does ("" until the
	// poller read it). GUARDED_BY(b.mu) (contend.go)
	contended chan struct{}
	wanted    bool
	wantedBy  []int // the waiting processes seen
	lockKey   string

	// tokenBusy is set while a NextToken call uses the token lock. The OFD
	// lock excludes other descriptions only, so concurrent calls on this
	// lease exclude each other with it; they poll, like the OFD lock.
	tokenBusy atomic.Bool
}

func newLease(b *Backend, id lockmgr.LockID, rel string, bk backing, mode lockmgr.Mode) *lease {
	return &lease{b: b, id: id, rel: rel, backing: bk, mode: mode}
}

// Mode returns the mode the flock is held in, or 0 once the lease was lost
// or released.
func (l *lease) Mode() lockmgr.Mode {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mode
}

// Done returns nil while the lease is held: a kernel flock is never taken
// away behind its holder's back, so there is nothing to watch. The one way
// to lose it is a failed upgrade (see Convert), which Convert reports by
// returning an error wrapping lockmgr.ErrLeaseLost; from then on Done
// returns a closed channel and Err the cause, so status readers see it.
func (l *lease) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostc
}

// Err returns why the lease was lost (wrapping lockmgr.ErrLeaseLost), or nil.
func (l *lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostErr
}

// Convert changes the flock's mode on the same descriptor.
//
// A downgrade (LOCK_SH on a descriptor holding LOCK_EX) cannot fail: the
// kernel swaps the lock under one spinlock, and nobody else can hold it.
//
// An upgrade cannot be made atomic with flock(2): when LOCK_EX|LOCK_NB fails
// on a descriptor holding LOCK_SH, Linux has already removed the shared lock
// (fs/locks.c flock_lock_inode deletes the old lock before it looks for
// conflicts). Convert therefore re-takes LOCK_SH|LOCK_NB at once after each
// failed attempt. If even that fails, someone took the lock exclusively in
// the gap: the claim is gone, the lease is dead, and Convert returns an
// error wrapping lockmgr.ErrLeaseLost.
//
// With wait, Convert polls, repeating that cycle with jittered exponential
// backoff (1 ms doubling to 50 ms) until granted or ctx ends; so an upgrade
// waiting on other processes' shared holds (another daemon, flock(1) on
// SOURCE) costs a few system calls per poll. It must not wait in the
// kernel (through flock(1) as Claim does): a blocking LOCK_EX drops the
// shared lock first and then waits, which would leave the engine's shared
// holders unprotected for the whole wait. Polling keeps the shared claim
// except for the microseconds of each attempt, at the price of fairness: a
// waiter queued in the kernel may be served first.
func (l *lease) Convert(ctx context.Context, mode lockmgr.Mode, wait bool) error {
	if _, err := flockOp(mode); err != nil {
		return l.errorf("convert to %v", err, mode)
	}
	if err := l.b.enter(); err != nil {
		return l.errorf("convert to %v", err, mode)
	}
	defer l.b.inflight.Done()

	l.mu.Lock()
	cur, lostErr, released := l.mode, l.lostErr, l.released
	l.mu.Unlock()
	switch {
	case lostErr != nil:
		return lostErr
	case released:
		return l.errorf("convert to %v", lockmgr.ErrNotHeld, mode)
	case cur == mode:
		return nil
	}

	if mode == lockmgr.Shared {
		err := fdDo(l.file, func(fd int) error { return l.b.flockNB(fd, unix.LOCK_SH) })
		if err != nil {
			return l.lose(fmt.Sprintf("downgrade failed: %v", err))
		}
		l.setMode(lockmgr.Shared)
		return nil
	}

	bo := backoff.New(upgradePollMin, upgradePollMax)
	for {
		granted, err := l.tryUpgrade()
		if err != nil {
			return err
		}
		if granted {
			l.setMode(lockmgr.Exclusive)
			return nil
		}
		if !wait {
			return l.errorf("convert to %v", lockmgr.ErrWouldBlock, mode)
		}
		if err := pollSleep(ctx, bo, l.b.closeCtx.Done()); err != nil {
			return l.errorf("convert to %v", err, mode)
		}
	}
}

// tryUpgrade makes one LOCK_EX|LOCK_NB attempt on the descriptor, which
// holds LOCK_SH, and re-takes LOCK_SH at once if the attempt failed and so
// dropped it. It reports whether the upgrade was granted; it returns an error
// wrapping lockmgr.ErrLeaseLost if the shared lock could not be re-taken.
func (l *lease) tryUpgrade() (bool, error) {
	var exErr, shErr error
	err := fdDo(l.file, func(fd int) error {
		if exErr = l.b.flockNB(fd, unix.LOCK_EX); exErr != nil {
			if testHookUpgradeGap != nil {
				testHookUpgradeGap()
			}
			shErr = l.b.flockNB(fd, unix.LOCK_SH)
		}
		return nil
	})
	switch {
	case err != nil:
		return false, l.errorf("convert to %v", err, lockmgr.Exclusive)
	case exErr == nil:
		return true, nil
	case shErr != nil:
		return false, l.lose(fmt.Sprintf("an upgrade attempt (%v) dropped the shared lock and re-taking it failed: %v", exErr, shErr))
	case !wouldBlock(exErr):
		return false, l.errorf("convert to %v", exErr, lockmgr.Exclusive)
	}
	// In the gap, the lock was free: an rmdir may have removed the
	// backing file, or a rename moved its directory (holding it
	// exclusively), and the shared lock just re-taken is then on a file
	// that is not this lock's any more.
	if gone, err := l.b.unnamed(l.backing, l.rel); err != nil || gone {
		return false, l.lose(fmt.Sprintf("an upgrade attempt (%v) dropped the shared lock and the backing file was removed before it was re-taken (stat: %v)", exErr, err))
	}
	return false, nil
}

// testHookUpgradeGap, if set by a test, runs after a failed upgrade attempt
// dropped the shared lock and before it is re-taken.
var testHookUpgradeGap func()

// Release unlocks the descriptor and keeps it briefly for the next claim of
// the same file (idle.go), or, for a shared claim, keeps it locked for up to
// keepFor (keep.go); a lost lease's descriptor is closed. A lease that
// someone outside was seen waiting for (Contended) is unlocked at once
// and its descriptor marked yielded (contend.go). It returns nil, also on
// a lost lease or a second call, and after Backend.Close released it.
func (l *lease) Release(ctx context.Context) error {
	wanted := l.b.unwatch(l)
	l.mu.Lock()
	done, lost, shared := l.released, l.lostErr != nil, l.mode == lockmgr.Shared
	l.released = true
	l.mode = 0
	l.mu.Unlock()
	switch {
	case done:
		l.b.forget(l)
	case lost:
		l.b.forget(l)
		l.file.Close()
	default:
		l.b.putIdle(l, shared && !wanted)
	}
	return nil
}

// closeFile closes the descriptor once, releasing the flock, and marks the
// lease released.
func (l *lease) closeFile() {
	l.b.unwatch(l)
	l.mu.Lock()
	done := l.released
	l.released = true
	l.mode = 0
	l.mu.Unlock()
	if !done {
		l.file.Close()
	}
}

func (l *lease) setMode(m lockmgr.Mode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr == nil && !l.released {
		l.mode = m
	}
}

// lose marks the lease lost, once, and returns the loss error. The
// descriptor stays open (holding nothing) until Release.
func (l *lease) lose(cause string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr == nil {
		l.lostErr = fmt.Errorf("%s: %w: %s", l.id, lockmgr.ErrLeaseLost, cause)
		l.mode = 0
		l.lostc = make(chan struct{})
		close(l.lostc)
	}
	return l.lostErr
}

// errorf wraps err with an operation on this lease: "<op> <id>: <err>".
func (l *lease) errorf(op string, err error, args ...any) error {
	return fmt.Errorf("%s %s: %w", fmt.Sprintf(op, args...), l.id, err)
}
