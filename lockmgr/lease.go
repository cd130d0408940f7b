package lockmgr

import (
	"context"
	"errors"
	"fmt"
)

// ErrBroken is wrapped in ErrLeaseLost when an operator broke a lock.
var ErrBroken = errors.New("broken by an operator")

// watchLocked starts a goroutine that marks ls's holds lost if lease is
// lost. Leases that cannot be lost (Done returns nil) need no watcher.
func (e *Engine) watchLocked(ls *lockState, lease Lease) {
	done := lease.Done()
	if done == nil {
		return
	}
	unwatch := make(chan struct{})
	ls.unwatch = unwatch
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
		e.mu.Lock()
		if ls.lease == lease {
			err := lease.Err()
			if err == nil {
				err = ErrLeaseLost
			}
			e.loseLocked(ls, lease, err)
			e.settleLocked(ls)
		}
		e.mu.Unlock()
	}()
}

// unwatchLocked stops ls's lease watcher, if any.
func (ls *lockState) unwatchLocked() {
	if ls.unwatch != nil {
		close(ls.unwatch)
		ls.unwatch = nil
	}
}

// loseLocked marks every live hold of ls lost and tells OnLoss about each.
// The holds stay in the table, conflicting with nobody, until their owners
// release them; lock calls on them fail with ErrLeaseLost.
func (e *Engine) loseLocked(ls *lockState, lease Lease, cause error) {
	if !errors.Is(cause, ErrLeaseLost) {
		cause = fmt.Errorf("%w: %v", ErrLeaseLost, cause)
	}
	var lost []LostHold
	for _, h := range ls.holds {
		if h.lost != nil {
			continue
		}
		ls.change(h, func() { h.lost = cause })
		lost = append(lost, LostHold{Lock: ls.id, Holder: e.holderLocked(ls, h), Err: cause})
		e.log.WithError(cause).WithFields(map[string]any{
			"path": ls.id.String(), "mode": h.explicit.String(), "pid": h.lineage.Self().PID,
			"uid": h.uid, "host": e.host, "token": h.token,
		}).Error("lock lost")
	}
	ls.broadcastLocked()
	if e.obs != nil {
		broken := errors.Is(cause, ErrBroken)
		for range lost {
			e.obs.Lost(ls.id, broken)
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
	if ls == nil || len(ls.holds) == 0 {
		return fmt.Errorf("break %s: %w", id, ErrNotHeld)
	}
	for ls.busy {
		if err := e.waitChangeLocked(ctx, ls, 0, 0); err != nil {
			return fmt.Errorf("break %s: %w", id, err)
		}
	}
	e.loseLocked(ls, ls.lease, fmt.Errorf("%w: %w", ErrLeaseLost, ErrBroken))
	e.settleLocked(ls)
	return nil
}
