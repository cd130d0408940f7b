package lockmgr

import (
	"context"
	"errors"
)

// convertUnlocksMu handles a request by an owner that already holds the lock
// explicitly: same mode is a no-op, a downgrade is immediate, an upgrade
// follows the owner class's kernel semantics. mu is held on entry and
// released on return.
func (e *Engine) convertUnlocksMu(ctx context.Context, ls *lockState, h *hold, rc *reqCtx) (Grant, error) {
	req := rc.req
	if h.lostErr() != nil {
		err := h.lostErr()
		e.mu.Unlock()
		return Grant{}, err
	}
	switch {
	case h.explicit == req.Mode:
		r := h.rareOf()
		tok, due := r.token, r.tokenDue
		e.mu.Unlock()
		if due && !req.DeferToken {
			return e.issueToken(ctx, req)
		}
		return Grant{Token: tok}, nil
	case req.Mode == Shared: // downgrade
		ls.change(h, func() { h.explicit = Shared })
		e.broadcastLocked(ls)
		e.settleDropsMu(ls)
		e.mu.Unlock()
		return e.issueToken(ctx, req)
	}
	up := step{id: req.Lock, mode: Exclusive, explicit: true}
	if req.Owner.Class == OwnerPOSIX || !req.Wait {
		// Atomic: keep the shared hold while trying or waiting.
		if err := e.stepDropsMu(ctx, up, rc); err != nil {
			e.mu.Unlock()
			return Grant{}, err
		}
		e.mu.Unlock()
		return e.issueToken(ctx, req)
	}
	// flock(2): try at once; if that fails, drop the shared hold and wait.
	nb := *rc
	nb.req.Wait = false
	err := e.stepDropsMu(ctx, up, &nb)
	if err == nil {
		e.mu.Unlock()
		return e.issueToken(ctx, req)
	}
	if !errors.Is(err, ErrWouldBlock) {
		e.mu.Unlock()
		return Grant{}, err
	}
	ls.change(h, func() { h.explicit = 0 })
	if h.implicit == 0 {
		e.dropHoldLocked(ls, h)
	}
	if cycle, _ := e.closesCycleLocked(ls, up, rc, nil); !e.grantableLocked(ls, up, rc, nil) && cycle {
		// Waiting would deadlock even without the shared hold: say so and
		// keep the hold, rather than lose it for nothing.
		if ls.holds.get(h.owner) == nil {
			ls.insert(h)
		}
		ls.change(h, func() { h.explicit = Shared })
		e.mu.Unlock()
		return Grant{}, ErrDeadlock
	}
	e.broadcastLocked(ls)
	if err := e.stepDropsMu(ctx, up, rc); err != nil {
		// As in the kernel, a failed conversion leaves no lock at all.
		steps := plan(req.Lock, req.Mode)
		e.rollbackDropsMu(steps[:len(steps)-1], req.Owner)
		e.mu.Unlock()
		return Grant{}, err
	}
	e.mu.Unlock()
	return e.issueToken(ctx, req)
}
