package lockmgr

import (
	"context"
	"errors"
	"fmt"
)

// ErrBroken is wrapped in ErrLeaseLost when an operator broke a lock.
var ErrBroken = errors.New("broken by an operator")

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
