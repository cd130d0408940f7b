package lockmgr

import (
	"context"
	"errors"
)

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
		cc := newClaimCtx(ctx, e.ctx)
		defer cc.end()
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

// addHoldLocked records a granted step. A hold only adds conflicts, so it
// wakes no waiter, except those that descend from its process: they may
// now jump the queue (privilegedLocked).
func (e *Engine) addHoldLocked(ls *lockState, s step, rc *reqCtx) {
	h := ls.holds[rc.req.Owner]
	if h == nil {
		h = &hold{owner: rc.req.Owner, id: ls.id, tid: int32(rc.req.TID), uid: rc.req.UID, since: e.now(), ino: rc.req.Ino}
		e.setTakerLocked(h, rc.lineage)
		ls.insert(h)
	}
	if s.explicit {
		if h.explicit != s.mode {
			h.since = e.now()
		}
		ls.change(h, func() { h.explicit = s.mode })
		if rc.lineage.Self() != h.lineage.Self() || len(h.heirs) > 0 || h.scanned {
			e.setTakerLocked(h, rc.lineage)
		}
		h.lineage, h.tid, h.uid = rc.lineage, int32(rc.req.TID), rc.req.UID
		if rc.req.Ino != 0 {
			h.ino = rc.req.Ino
		}
		if s.id.Kind == KindUsage {
			e.usage[h] = struct{}{}
		}
	} else {
		ls.change(h, func() { h.implicit++ })
	}
	ls.notifyLocked()
	if p := rc.lineage.Self(); p != (ProcID{}) {
		e.wakeUnderHoldLocked(ls, p, h)
	}
}

// dropHoldLocked removes h from the table.
func (e *Engine) dropHoldLocked(ls *lockState, h *hold) {
	ls.remove(h)
	delete(e.usage, h)
	e.untrackAllLocked(h)
}
