package lockmgr

// The lease the engine holds for a lock, from the backend, in the order of
// its life: claimed or converted for a step it does not cover
// (claimDropsMu, with the claim's context a lazyctx.Ctx), watched for loss
// (watchLocked; loseDropsMu marks the holds lost), given up when someone
// outside this engine wants it (# Fairness across daemons, below), and
// broken by an operator (Break).

import (
	"context"
	"errors"
	"fmt"

	"github.com/lockfs/lockfs/internal/lazyctx"
)

// ErrBroken is wrapped in ErrLeaseLost when an operator broke a lock.
var ErrBroken = errors.New("broken by an operator")

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

// watchLocked arranges for ls's holds to be marked lost if lease is lost:
// through the lease's OnLost if it has one (LossNotifier), else with a
// goroutine that waits on Done. Leases that cannot be lost (Done returns
// nil) need no watcher.
func (e *Engine) watchLocked(ls *lockState, lease Lease) {
	lost := func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.closed || ls.lease != lease {
			return
		}
		err := lease.Err()
		if err == nil {
			err = ErrLeaseLost
		}
		e.loseDropsMu(ls, lease, err)
		e.settleDropsMu(ls)
	}
	if n, ok := lease.(LossNotifier); ok {
		ls.unwatch = n.OnLost(lost)
		return
	}
	done := lease.Done()
	if done == nil {
		return
	}
	unwatch := make(chan struct{})
	ls.unwatch = func() { close(unwatch) }
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		select {
		case <-done:
		case <-unwatch:
			return
		case <-e.closing:
			return
		}
		lost()
	}()
}

// setLeaseLocked makes lease ls's lease (nil: none) and resets the give-up
// state, which belongs to the lease.
func (ls *lockState) setLeaseLocked(lease Lease) {
	ls.lease = lease
	ls.contended, ls.askedContended, ls.yielding = nil, false, false
}

// unwatchLocked stops ls's lease watcher, if any.
func (ls *lockState) unwatchLocked() {
	if ls.unwatch != nil {
		ls.unwatch()
		ls.unwatch = nil
	}
}

// # Fairness across daemons
//
// SPEC §2.7: giving up a lease that someone outside this engine waits
// for.
//
// Within the host, the engine's FIFO queue is fair. But the lease is the
// host's one claim on the lock, and while local requests keep coming, the
// engine could hand it from one local holder to the next for ever: another
// host, another daemon over the same SOURCE, or a program that flocks
// SOURCE's backing file would wait until it timed out. So:
//
//   - When a local request first waits behind the holds of a leased lock
//     (a hand-on to it is foreseeable), or is granted the lease while other
//     holds share it, the engine asks the lease, once, whether its backend
//     can tell of outside waiters (ContendedLease). Leases that are taken
//     and given back with no local demand in between are never asked, so
//     the backend's watch costs nothing when nobody competes here.
//   - Once the lease's Contended channel is closed, the lock is yielding:
//     no new request is granted on that lease, and settleDropsMu no longer
//     hands it to the next local waiter. The holds running then finish;
//     the last one's release gives the lease back (the backend keeps no
//     warm or kept claim of a yielding lease: that is the backend's side
//     of the contract). The local waiters then claim through the backend,
//     with wait, like anyone else, and queue behind the outside waiter.
//     Among themselves they keep their FIFO order.
//   - Privileged requests are no new demand for the lease and are granted
//     as before: a conversion or a second request of an owner that holds
//     the lock, and a request whose lineage holds it (a child under its
//     parent's lock). Refusing them would deadlock the holds the lease
//     waits for. The usage rule only lets through requests for locks the
//     lineage holds, which are privileged.
//   - A request that the yield holds back waits for every live hold of
//     the lock, as if an exclusive waiter stood before it: that is what
//     deadlock detection (blocksLocked) counts. A request without wait
//     gets ErrWouldBlock.
//   - The yield ends with the lease: a lease lost, broken, released at
//     Close or given back starts a fresh state (setLeaseLocked).
//
// A Contended channel may close at any time, from the backend's own
// goroutine; the engine needs no goroutine of its own to react, because a
// lease is only ever reused at a grant or a hand-on, and both look.

// watchContendedLocked asks ls's lease, once per lease, for its Contended
// channel. ContendedLease.Contended does not block: it is called under mu.
func (e *Engine) watchContendedLocked(ls *lockState) {
	if ls.askedContended || ls.lease == nil || e.keepContended {
		return
	}
	ls.askedContended = true
	if cl, ok := ls.lease.(ContendedLease); ok {
		ls.contended = cl.Contended()
	}
}

// yieldingLocked reports whether ls's lease is known to be wanted outside
// this engine. The first time it is, the Observer hears of the give-up.
func (e *Engine) yieldingLocked(ls *lockState) bool {
	if !ls.yielding && ls.contended != nil {
		select {
		case <-ls.contended:
			ls.yielding = true
			if e.obs != nil {
				e.obs.Yielded(ls.id)
			}
		default:
		}
	}
	return ls.yielding
}

// yieldBlocksLocked reports whether step s of rc must wait for ls's lease
// to be given back: the lease is yielding, s needs it, and rc is no
// privileged request (its owner or lineage holds no live hold of ls).
func (e *Engine) yieldBlocksLocked(ls *lockState, s step, rc *reqCtx) bool {
	return ls.lease != nil && e.needsLease(s) && e.yieldingLocked(ls) && !e.privilegedLocked(ls, rc)
}

// handOnYieldsLocked is settleDropsMu's question before it hands ls's lease,
// which no hold needs any more, to the waiter at the head of the queue: is
// the lease wanted outside? Then it is given back instead.
func (e *Engine) handOnYieldsLocked(ls *lockState) bool {
	e.watchContendedLocked(ls)
	return e.yieldingLocked(ls)
}

// loseDropsMu marks every live hold of ls lost, and with each the other holds
// of the same owner (its implicit holds on ancestors exist only on behalf
// of its lock, and its lock is unprotected once any of them is), and tells
// OnLoss once per explicit hold so marked. The holds stay in the table,
// conflicting with nobody, until their owners release them; lock calls on
// them fail with ErrLeaseLost. Other locks whose holds were marked are
// settled (their leases given back if nothing else needs them). A POSIX
// owner (one process) that holds several control files loses them all.
func (e *Engine) loseDropsMu(ls *lockState, lease Lease, cause error) {
	if !errors.Is(cause, ErrLeaseLost) {
		cause = fmt.Errorf("%w: %v", ErrLeaseLost, cause)
	}
	owners := make(map[Owner]bool)
	for o, h := range ls.holds.all() {
		if h.lostErr() == nil {
			owners[o] = true
		}
	}
	if len(owners) == 0 {
		return
	}
	var lost []LostHold
	var others []*lockState
	for _, l := range e.locks {
		touched := false
		for o := range owners {
			h := l.holds.get(o)
			if h == nil || h.lostErr() != nil {
				continue
			}
			l.change(h, func() { h.setFate().lost = cause })
			touched = true
			if h.explicit == 0 {
				continue
			}
			lost = append(lost, LostHold{Lock: l.id, Holder: e.holderLocked(l, h), Err: cause})
			e.log.WithError(cause).WithFields(map[string]any{
				"path": l.id.String(), "kind": l.id.Kind.String(), "mode": h.explicit.String(),
				"pid": h.lineage.Self().PID, "uid": h.uid, "host": e.host, "token": h.rareOf().token,
			}).Error("lock lost")
		}
		if touched {
			e.broadcastLocked(l)
			if l != ls {
				others = append(others, l)
			}
		}
	}
	if e.obs != nil {
		broken := errors.Is(cause, ErrBroken)
		for _, l := range lost {
			e.obs.Lost(l.Lock, broken)
		}
	}
	if e.onLoss != nil && len(lost) > 0 {
		// OnLoss runs without engine locks: hand it off.
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			for _, l := range lost {
				e.onLoss(l)
			}
		}()
	}
	for _, l := range others {
		e.settleDropsMu(l)
	}
}

// Break forcibly ends every hold of id, as a lost lease would (SPEC §5):
// holders are told through OnLoss, their lock calls fail with ErrLeaseLost,
// and the host's claim is given back so that waiters, here and on other
// hosts, proceed.
func (e *Engine) Break(ctx context.Context, id LockID) error {
	p, err := CleanPath(id.Path)
	if err != nil {
		return fmt.Errorf("break %s: %v: %w", id, err, ErrInvalid)
	}
	id.Path = p
	e.mu.Lock()
	defer e.mu.Unlock()
	ls := e.locks[id]
	if ls == nil || ls.holds.len() == 0 {
		return fmt.Errorf("break %s: %w", id, ErrNotHeld)
	}
	for ls.busy {
		if err := e.waitChangeDropsMu(ctx, ls, 0); err != nil {
			return fmt.Errorf("break %s: %w", id, err)
		}
	}
	e.loseDropsMu(ls, ls.lease, fmt.Errorf("%w: %w", ErrLeaseLost, ErrBroken))
	e.settleDropsMu(ls)
	return nil
}
