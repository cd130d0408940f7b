package lockmgr

import (
	"context"
	"fmt"
)

// Release ends owner's explicit hold on id and the implicit holds taken with
// it. It never waits for other processes. It returns ErrNotHeld (wrapped)
// if owner holds no explicit lock on id; unlocking an unheld lock succeeds
// in the kernel, so callers usually ignore that.
func (e *Engine) Release(ctx context.Context, id LockID, owner Owner) error {
	p, err := CleanPath(id.Path)
	if err != nil {
		return fmt.Errorf("release %s: %v: %w", id, err, ErrInvalid)
	}
	id.Path = p
	defer e.endRelease(e.beginRelease())
	ls := e.locks[id]
	var h *hold
	if ls != nil {
		h = ls.holds.get(owner)
	}
	if h == nil || h.explicit == 0 {
		return fmt.Errorf("release %s: %w", id, ErrNotHeld)
	}
	mode := h.explicit
	var adopted []LockID
	if r := h.rare; r != nil && r.fate != nil {
		adopted, r.fate.adopted = r.fate.adopted, nil
	}
	ls.change(h, func() { h.explicit = 0 })
	delete(e.usage, h)
	if h.implicit == 0 {
		e.dropHoldLocked(ls, h)
	}
	e.broadcastLocked(ls)
	steps := plan(id, mode)
	e.rollbackDropsMu(steps[:len(steps)-1], owner)
	e.settleDropsMu(ls)
	for _, child := range adopted {
		e.releaseAdoptedDropsMu(child, owner)
	}
	return nil
}

// beginRelease takes mu for a release and returns the count of wake-ups
// sent so far, for endRelease.
func (e *Engine) beginRelease() (wakes uint64) {
	e.mu.Lock()
	return e.wakes
}

// endRelease drops mu after a release begun when wakes wake-ups had been
// sent. If the release woke a waiter, it yields once (Engine.yield), so
// that the waiter runs at once on this thread. (Two calls, not a returned
// closure: a closure would cost an allocation per release.)
func (e *Engine) endRelease(wakes uint64) {
	woke := e.wakes != wakes
	e.mu.Unlock()
	if woke {
		e.yield()
	}
}

// releaseAdoptedDropsMu releases a new directory's lock that came with a
// new-dir lock, unless its owner has released it already.
func (e *Engine) releaseAdoptedDropsMu(id LockID, owner Owner) {
	ls := e.locks[id]
	if ls == nil {
		return
	}
	h := ls.holds.get(owner)
	if h == nil || h.explicit == 0 {
		return
	}
	steps := plan(id, h.explicit)
	e.rollbackDropsMu(steps, owner)
}

// releaseStepDropsMu undoes one implicit step of owner.
func (e *Engine) releaseStepDropsMu(s step, owner Owner) {
	ls := e.locks[s.id]
	if ls == nil {
		return
	}
	h := ls.holds.get(owner)
	if h == nil {
		return
	}
	if s.explicit {
		ls.change(h, func() { h.explicit = 0 })
		delete(e.usage, h)
	} else if h.implicit > 0 {
		ls.change(h, func() { h.implicit-- })
	}
	if h.explicit == 0 && h.implicit == 0 {
		e.dropHoldLocked(ls, h)
	}
	e.broadcastLocked(ls)
	e.settleDropsMu(ls)
}

// settleDropsMu brings ls's lease in line with its holds once no backend call
// is in flight: released when nothing holds or waits for the lock,
// downgraded when only shared holds remain, and the table entry dropped when
// idle. Upgrades are the acquirer's business. mu is held on entry and on
// return, and dropped for backend calls.
func (e *Engine) settleDropsMu(ls *lockState) {
	for !ls.busy {
		need := e.leaseModeLocked(ls)
		if ls.lease == nil {
			if ls.idleLocked() && e.locks[ls.id] == ls {
				delete(e.locks, ls.id)
			}
			return
		}
		lease := ls.lease
		if need >= lease.Mode() && lease.Err() == nil {
			return
		}
		if need == 0 && ls.head != nil && e.needsLease(ls.head.step) && lease.Err() == nil && lease.Mode() >= ls.head.step.mode &&
			e.grantableLocked(ls, ls.head.step, ls.head.rc, ls.head) && !e.handOnYieldsLocked(ls) {
			// A waiter is about to be granted: hand the lease over
			// rather than give it back and claim it again. A lease too
			// weak for it is given back instead: upgrading a claim that
			// no hold needs would hold it while waiting, and two hosts
			// doing so would wait for each other. So is a lease for a
			// head that local holds still block (over a hierarchical
			// backend, implicit ones that need no lease): kept, it
			// would keep other hosts out for as long as those holds
			// last, and they may be waiting for those very hosts. And
			// so is a lease that someone outside waits for (lease.go).
			return
		}
		release := need == 0 || lease.Err() != nil
		// A settle waits for no other holder: a request without wait
		// that meets it waits for it rather than fail (busyWaits).
		ls.busy, ls.busyWaits, ls.settling, ls.settleTo = true, false, true, need
		if release {
			ls.settleTo = 0
			ls.unwatchLocked()
		}
		e.mu.Unlock()
		// Backends bound their own calls; a release must not be cut short.
		ctx := context.Background()
		var err error
		if release {
			err = lease.Release(ctx)
		} else {
			err = lease.Convert(ctx, need, false)
		}
		e.mu.Lock()
		ls.busy, ls.settling = false, false
		if release {
			ls.setLeaseLocked(nil)
		}
		e.broadcastLocked(ls)
		if err != nil {
			e.log.WithError(err).WithField("path", ls.id.String()).Warn("backend release or downgrade failed")
			if !release {
				// Keep the stronger claim; it is still safe.
				return
			}
		}
	}
}
