package lockmgr

import (
	"context"
	"errors"

	"github.com/lockfs/lockfs/internal/lazyctx"
)

// Granting one step of a request's plan (acquire.go), in the order a step
// runs: stepDropsMu waits until the step may be granted; grantableLocked
// decides whether it may, as far as this host's processes go (conflicting
// holds, exemptions by lineage, FIFO; yield.go adds the lease's give-up);
// takeDropsMu takes it once the lease covers it, or brings the lease up
// (claimDropsMu, the backend call, with the claim's context a lazyctx.Ctx);
// addHoldLocked (state.go, beside the table it changes) records the hold.
// While it waits for a claim, a request is in the lock's outside set
// (outsideWait, below); its wait in the queue is wait.go's.

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
			// grants could keep it for ever (yield.go).
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

// heldModeLocked is the strongest mode any live hold needs.
func (ls *lockState) heldModeLocked() Mode {
	switch {
	case ls.nExclusive > 0:
		return Exclusive
	case ls.nLive > 0:
		return Shared
	}
	return 0
}

// explicitModeLocked is the strongest mode any live explicit hold needs.
func (ls *lockState) explicitModeLocked() Mode {
	switch {
	case ls.nExplicitExclusive > 0:
		return Exclusive
	case ls.nExplicit > 0:
		return Shared
	}
	return 0
}

// needsLease reports whether step s must be covered by its lock's lease:
// always, except an implicit step over a hierarchical backend.
func (e *Engine) needsLease(s step) bool {
	return s.explicit || !e.hier
}

// claimDropsMu brings ls's lease up to mode need, dropping mu for the
// backend call. On return mu is held and ls.busy is false.
func (e *Engine) claimDropsMu(ctx context.Context, ls *lockState, need Mode, wait bool) error {
	lease := ls.lease
	// A lease that no hold needs is given back and claimed anew rather
	// than upgraded: an upgrade keeps the old claim while it waits, and
	// two hosts upgrading claims nobody needs would wait for each other.
	var stale Lease
	if lease != nil && e.leaseModeLocked(ls) == 0 {
		stale, lease = lease, nil
		ls.setLeaseLocked(nil)
		ls.unwatchLocked()
	}
	ls.busy, ls.busyWaits = true, wait
	e.mu.Unlock()
	if stale != nil {
		if err := stale.Release(context.WithoutCancel(ctx)); err != nil {
			e.log.WithError(err).WithField("path", ls.id.String()).Warn("backend release failed")
		}
	}

	bctx := ctx
	if wait {
		// The request's context, also ended when the engine closes; the
		// merge is made only if the backend looks at it (most claims do
		// not: the flock is free).
		cc := lazyctx.New(ctx, e.ctx)
		defer cc.Cancel()
		bctx = cc
	}
	var err error
	var fresh Lease
	if lease == nil {
		fresh, err = e.backend.Claim(bctx, ls.id, need, wait)
	} else {
		err = lease.Convert(bctx, need, wait)
	}

	e.mu.Lock()
	ls.busy, ls.busyWaits = false, false
	e.broadcastLocked(ls)
	if fresh != nil {
		ls.setLeaseLocked(fresh)
		e.watchLocked(ls, fresh)
	}
	if err != nil && lease != nil && errors.Is(err, ErrLeaseLost) {
		e.loseDropsMu(ls, lease, err)
	}
	if err != nil && e.closed {
		return ErrClosed
	}
	return err
}
