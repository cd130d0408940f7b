package lockmgr

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Granting a request's plan (acquire.go makes it), top down: the loop over
// its steps, parkedRequest.runUnlocksMu for AcquireAsync (stepDropsMu, the
// same for one step of Acquire, waits on its goroutine instead of parking);
// one step, in the order it runs: tryStepDropsMu takes, fails or queues
// it; grantableLocked decides whether it may be granted, as far as this host's processes go (conflicting
// holds, exemptions by lineage, FIFO; lease.go adds the lease's give-up);
// takeDropsMu takes it once the lease covers it, or brings the lease up
// (lease.go claimDropsMu, the backend call);
// addHoldLocked (state.go, beside the table it changes) records the hold.
// While it waits for a claim, a request is in the lock's outside set
// (outsideWait, below); its wait in the queue is wait.go's. Once every step
// is held, issueToken gives the grant its token; a failed step's request
// gives back the steps it took (rollbackDropsMu).

// parkedRequest is a request of AcquireAsync between its steps.
type parkedRequest struct {
	// Constant data
	e      *Engine
	ctx    context.Context
	rc     *reqCtx
	steps  []step
	start  time.Time // for the observer
	answer func(Grant, error)

	// Mutable state, GUARDED_BY(e.mu) while the request is parked; owned
	// by the goroutine that runs it otherwise.
	// i is the step being taken.
	i int
	// sw is step i's wait.
	sw stepWait
	// stop ends the watch of ctx while parked (context.AfterFunc).
	stop func() bool
}

// runUnlocksMu takes the steps from a.i on until the request is answered or
// parks. mu is held on entry and dropped on return.
func (a *parkedRequest) runUnlocksMu() {
	e := a.e
	for a.i < len(a.steps) {
		s := a.steps[a.i]
		err := e.tryStepDropsMu(a.ctx, s, a.rc, &a.sw)
		if err == errSleep {
			var parked bool
			if parked, err = a.parkDropsMu(); parked {
				e.mu.Unlock()
				return
			}
			if err == nil {
				continue // woken already: look again
			}
		}
		a.sw.endDropsMu(e, s)
		if err != nil {
			e.rollbackDropsMu(a.steps[:a.i], a.rc.req.Owner)
			e.mu.Unlock()
			a.finish(Grant{}, err)
			return
		}
		a.i++
	}
	e.mu.Unlock()
	a.finish(e.issueToken(a.ctx, a.rc.req))
}

// finish reports the outcome and answers. mu is not held.
func (a *parkedRequest) finish(g Grant, err error) {
	a.answer(a.e.answered(a.rc.req, a.start, g, err))
}

// stepDropsMu takes one step of a plan: it waits until the step can be
// granted locally and the lease covers it, then records the hold. mu is
// held on entry and on return, and dropped while waiting.
func (e *Engine) stepDropsMu(ctx context.Context, s step, rc *reqCtx) error {
	var sw stepWait
	defer sw.endDropsMu(e, s)
	for {
		if err := e.tryStepDropsMu(ctx, s, rc, &sw); err != errSleep {
			return err
		}
		if err := e.sleepDropsMu(ctx, sw.w, &sw.self); err != nil {
			return err
		}
	}
}

// stepWait is what a step keeps while it waits: its queue entry, its
// self-wait grace, and its entry in the outside set.
type stepWait struct {
	w    *waiter
	self selfWait
	// out registers the request in the lock's outside set while it
	// waits for the backend's claim (status).
	out outsideWait
}

// endDropsMu takes the step out of the queue and the outside set once it
// is granted, has failed or was cancelled.
func (sw *stepWait) endDropsMu(e *Engine, s step) {
	if sw.w != nil {
		e.leaveQueueDropsMu(s.id, sw.w)
	}
	sw.out.leaveLocked()
	*sw = stepWait{}
}

// outsideWait is a request's entry in a lock's outside set (lockState.
// outside) while it waits for the backend's claim.
type outsideWait struct {
	w  *waiter
	ls *lockState
}

// enterLocked registers the request once. A request already queued keeps
// its queue entry (status shows it once, as waiting outside).
func (o *outsideWait) enterLocked(e *Engine, ls *lockState, s step, rc *reqCtx, w *waiter) {
	if o.w != nil {
		return
	}
	o.w, o.ls = w, ls
	if o.w == nil {
		o.w = &waiter{step: s, rc: rc, since: e.now()}
	}
	if ls.outside == nil {
		ls.outside = make(map[*waiter]struct{})
	}
	ls.outside[o.w] = struct{}{}
}

// leaveLocked undoes enterLocked; a later enterLocked registers the
// request again.
func (o *outsideWait) leaveLocked() {
	if o.w != nil {
		delete(o.ls.outside, o.w)
	}
	*o = outsideWait{}
}

// errSleep: tryStepDropsMu left the step queued, to be looked at again
// when sw.w is woken.
var errSleep = errors.New("lockmgr: the step sleeps")

// tryStepDropsMu takes step s if it can be taken now, or fails it, or
// queues it (sw.w) and returns errSleep. mu is held on entry and on
// return; it is dropped only for backend calls (takeDropsMu) and to
// settle the lease.
func (e *Engine) tryStepDropsMu(ctx context.Context, s step, rc *reqCtx, sw *stepWait) error {
	for {
		if e.closed {
			return ErrClosed
		}
		ls := e.lockLocked(s.id)
		if e.grantableLocked(ls, s, rc, sw.w) && !e.yieldBlocksLocked(ls, s, rc) {
			done, err := e.takeDropsMu(ctx, ls, s, rc, &sw.w, &sw.out)
			if err != nil || done {
				return err
			}
			continue
		}
		if !rc.req.Wait {
			if e.noticeExitsDropsMu(ctx, ls, s, rc) {
				continue
			}
			return ErrWouldBlock
		}
		if err := e.refuseCycleLocked(ls, s, rc, sw.w, &sw.self); err != nil {
			return err
		}
		// It now waits for a hold here, not for the backend: status
		// must show it once, queued (a later backend wait enters the
		// outside set again, with the queue entry).
		sw.out.leaveLocked()
		if sw.w == nil {
			sw.w = e.enqueueLocked(ls, s, rc)
		}
		if ls.lease != nil && e.needsLease(s) {
			// A hand-on of the lease to this request is foreseeable:
			// learn from now on whether someone outside waits for it.
			e.watchContendedLocked(ls)
		}
		// A lease claimed or upgraded for this request, which lost the
		// lock to a hold granted meanwhile on the weaker lease, is more
		// than the holds need: bring it down while the request waits.
		// Other hosts may wait for it, and this lock's holders for them.
		e.settleDropsMu(ls)
		return errSleep
	}
}

// grantableLocked reports whether step s of rc (queued as w, or not yet
// queued if w is nil) can be granted now as far as this host's processes
// are concerned: no live hold conflicts with it (exemptions aside), and
// FIFO lets it go, or its lineage already holds the lock.
func (e *Engine) grantableLocked(ls *lockState, s step, rc *reqCtx, w *waiter) bool {
	if e.blockedByHoldsLocked(ls, s, rc) {
		return false
	}
	return ls.fifoOKLocked(s, w) || e.privilegedLocked(ls, rc)
}

// blockedByHoldsLocked reports whether a live hold of ls conflicts with
// step s of rc (exemptions aside).
func (e *Engine) blockedByHoldsLocked(ls *lockState, s step, rc *reqCtx) bool {
	if s.mode != Exclusive && ls.nExclusive == 0 {
		return false
	}
	for _, h := range ls.holds.all() {
		if h.owner != rc.req.Owner && Conflicts(h.mode(), s.mode) && !e.exemptLocked(h, s, rc) {
			return true
		}
	}
	return false
}

// fifoOKLocked reports whether FIFO lets step s (queued as w, or about to
// queue if w is nil) go now: no earlier waiter's mode conflicts with it.
func (ls *lockState) fifoOKLocked(s step, w *waiter) bool {
	if s.mode == Exclusive {
		return ls.head == nil || ls.head == w
	}
	return ls.firstX == nil || (w != nil && ls.firstX.seq > w.seq)
}

// takeDropsMu takes step s, which the engine's own table grants, once the
// lease covers it: at once if it does, after another request's backend call
// ends, or after a claim of its own. done reports that the hold is
// recorded; otherwise the caller looks again. *w, rc's queue entry, leaves
// the queue on the grant.
func (e *Engine) takeDropsMu(ctx context.Context, ls *lockState, s step, rc *reqCtx, w **waiter, out *outsideWait) (done bool, err error) {
	need := maxMode(e.leaseModeLocked(ls), s.mode)
	// A lease being downgraded or released (settling) still reports its
	// old mode: a hold that needs more than the mode it is going to
	// (settleTo) would outlive it (an exclusive hold under a shared kernel
	// flock, or any hold under no lease). One that needs no more, a shared
	// hold during a downgrade to shared, is safe at once.
	settleOK := !ls.settling || ls.settleTo >= need
	if !e.needsLease(s) || (settleOK && ls.lease != nil && ls.lease.Mode() >= need && ls.lease.Err() == nil) {
		if e.needsLease(s) && e.leaseModeLocked(ls) > 0 {
			// The lease is shared with other holds: a stream of such
			// grants could keep it for ever (lease.go).
			e.watchContendedLocked(ls)
		}
		if *w != nil {
			e.dequeueLocked(ls, *w)
			*w = nil
		}
		e.addHoldLocked(ls, s, rc)
		return true, nil
	}
	if rc.req.Wait {
		out.enterLocked(e, ls, s, rc, *w)
	}
	if ls.busy {
		if ls.busyWaits && !rc.req.Wait {
			return false, ErrWouldBlock
		}
		return false, e.waitChangeDropsMu(ctx, ls, rc.req.TID)
	}
	if err := e.claimDropsMu(ctx, ls, need, rc.req.Wait); err != nil {
		e.settleDropsMu(ls)
		return false, err
	}
	return false, nil
}

// leaseModeLocked is the mode ls's lease must have: the strongest mode of
// the live holds, or, over a hierarchical backend, of the live explicit
// holds only (implicit holds are the backend's business there).
func (e *Engine) leaseModeLocked(ls *lockState) Mode {
	if e.hier {
		return ls.explicitModeLocked()
	}
	return ls.heldModeLocked()
}

// needsLease reports whether step s must be covered by its lock's lease:
// always, except an implicit step over a hierarchical backend.
func (e *Engine) needsLease(s step) bool {
	return s.explicit || !e.hier
}

// issueToken asks the lease for the grant's fencing token and records it,
// or, if the request defers it, records that it is due (tokens.go).
func (e *Engine) issueToken(ctx context.Context, req Request) (Grant, error) {
	id, owner := req.Lock, req.Owner
	e.mu.Lock()
	ls := e.locks[id]
	var lease Lease
	if ls != nil {
		lease = ls.lease
		if h := ls.holds.get(owner); h != nil && req.DeferToken && lease != nil {
			e.newGrantLocked(h, 0, true)
			e.mu.Unlock()
			return Grant{}, nil
		}
	}
	e.mu.Unlock()
	if lease == nil {
		return Grant{}, fmt.Errorf("no lease after grant: %w", ErrLeaseLost)
	}
	// An interrupt that arrives once the lock is granted must not undo
	// the grant: the token is fetched without the request's cancellation.
	// Backends bound their own calls.
	tok, err := lease.NextToken(context.WithoutCancel(ctx))
	if err != nil {
		// The lock is held but cannot be fenced: give it back rather than
		// hand out a grant without a token.
		_ = e.Release(context.WithoutCancel(ctx), id, owner)
		return Grant{}, fmt.Errorf("fencing token: %w", err)
	}
	e.mu.Lock()
	if ls := e.locks[id]; ls != nil {
		if h := ls.holds.get(owner); h != nil {
			e.newGrantLocked(h, tok, false)
		}
	}
	e.mu.Unlock()
	return Grant{Token: tok}, nil
}

// newGrantLocked records a new explicit grant of h, numbered anew: with
// token tok, or, deferred, with its token due.
func (e *Engine) newGrantLocked(h *hold, tok uint64, deferred bool) {
	e.grants++
	r := h.setRare()
	r.grant, r.token, r.tokenDue, r.tokenWarned = e.grants, tok, deferred, false
}

// rollbackDropsMu undoes the implicit steps of a request that failed.
func (e *Engine) rollbackDropsMu(steps []step, owner Owner) {
	for i := len(steps) - 1; i >= 0; i-- {
		e.releaseStepDropsMu(steps[i], owner)
	}
}
