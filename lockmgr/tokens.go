package lockmgr

import "fmt"

// Deferred fencing tokens.
//
// A request with DeferToken is granted without a token: its hold is marked
// tokenDue, and the token is issued the first time somebody reads it
// (Status, SnapshotTokens, Token). Most locks taken through a mount are
// never asked for their token, and with the local backend a token is a
// read and a write of the backing file, made on every grant otherwise.
//
// Why a token issued late still fences: it is issued by the lease while
// the hold is held (the hold is checked, by identity, to be present and
// not lost both before and after the lease's NextToken), so it is greater
// than the token of every grant that ended before this one began, whether
// that token was read or not, and smaller than the token of every grant
// that begins after this one ends. A hold that was lost or released before
// anybody read its token never gets one (it shows as 0): a late reading
// cannot hand a lost holder a token newer than its successor's.

// dueToken is a hold whose token is due, with the lease to ask for it.
type dueToken struct {
	ls    *lockState
	h     *hold
	lease Lease
}

// dueLocked appends ls's holds whose token is due to out.
func (e *Engine) dueLocked(ls *lockState, out []dueToken) []dueToken {
	if ls.lease == nil {
		return out
	}
	for _, h := range ls.holds {
		if h.tokenDue && h.explicit != 0 && h.lost == nil {
			out = append(out, dueToken{ls: ls, h: h, lease: ls.lease})
		}
	}
	return out
}

// stillDueLocked reports whether d's hold is still held explicitly, not
// lost, and without its token. (A hold whose explicit part was released
// while it stays for a lock below keeps tokenDue until its next grant,
// which sets it again: only explicit holds have tokens.)
func stillDueLocked(d dueToken) bool {
	return d.ls.holds[d.h.owner] == d.h && d.h.tokenDue && d.h.explicit != 0 && d.h.lost == nil
}

// issue issues the tokens of due, one after the other, without mu.
// tokenMu makes concurrent readers take turns, so that no hold gets two.
// A failure leaves the hold without a token (0) and is logged.
func (e *Engine) issue(due []dueToken) {
	if len(due) == 0 {
		return
	}
	e.tokenMu.Lock()
	defer e.tokenMu.Unlock()
	for _, d := range due {
		e.mu.Lock()
		still := stillDueLocked(d)
		e.mu.Unlock()
		if !still {
			continue
		}
		tok, err := d.lease.NextToken(e.ctx)
		e.mu.Lock()
		if stillDueLocked(d) {
			d.h.tokenDue = false
			if err == nil {
				d.h.token = tok
			}
		} else {
			err = nil // the hold went meanwhile: its token is nobody's
		}
		pid := d.h.lineage.Self().PID
		e.mu.Unlock()
		if err != nil {
			e.log.WithError(err).WithFields(map[string]any{
				"path": d.ls.id.String(), "kind": d.ls.id.Kind.String(), "pid": pid,
			}).Warn("fencing token not issued: the holder's token reads 0")
		}
	}
}

// Token returns the fencing token of owner's explicit hold on id, issuing
// it first if its grant deferred it. It fails with ErrNotHeld if owner
// holds id only implicitly or not at all, and with the hold's loss if it
// was lost before its token was issued.
func (e *Engine) Token(id LockID, owner Owner) (uint64, error) {
	if p, err := CleanPath(id.Path); err == nil {
		id.Path = p
	}
	for {
		e.mu.Lock()
		var h *hold
		ls := e.locks[id]
		if ls != nil {
			h = ls.holds[owner]
		}
		switch {
		case h == nil || h.explicit == 0:
			e.mu.Unlock()
			return 0, fmt.Errorf("token of %s: %w", id, ErrNotHeld)
		case !h.tokenDue:
			tok := h.token
			e.mu.Unlock()
			if tok == 0 {
				return 0, fmt.Errorf("token of %s: none was issued (see the log)", id)
			}
			return tok, nil
		case h.lost != nil:
			err := h.lost
			e.mu.Unlock()
			return 0, fmt.Errorf("token of %s: %w", id, err)
		case ls.lease == nil:
			e.mu.Unlock()
			return 0, fmt.Errorf("token of %s: no lease: %w", id, ErrLeaseLost)
		}
		due := []dueToken{{ls: ls, h: h, lease: ls.lease}}
		e.mu.Unlock()
		e.issue(due)
	}
}

// SnapshotTokens is Snapshot with the tokens that grants deferred and
// nobody read yet issued first, on the locks pick accepts (all if pick is
// nil): what `lockfs status` shows.
func (e *Engine) SnapshotTokens(pick func(LockID) bool) []LockStatus {
	e.mu.Lock()
	var due []dueToken
	for id, ls := range e.locks {
		if pick == nil || pick(id) {
			due = e.dueLocked(ls, due)
		}
	}
	e.mu.Unlock()
	e.issue(due)
	return e.Snapshot()
}

// issueFor issues the due tokens of id's holds.
func (e *Engine) issueFor(id LockID) {
	e.mu.Lock()
	var due []dueToken
	if ls := e.locks[id]; ls != nil {
		due = e.dueLocked(ls, nil)
	}
	e.mu.Unlock()
	e.issue(due)
}
