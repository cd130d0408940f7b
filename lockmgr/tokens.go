package lockmgr

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Deferred fencing tokens.
//
// A request with DeferToken is granted without a token: its hold is marked
// tokenDue, and the token is issued the first time somebody reads it
// (StatusTokens, SnapshotTokens, Token). Most locks taken through a mount
// are never asked for their token, and with the local backend a token is a
// read and a write of the backing file, made on every grant otherwise.
//
// Why a token issued late still fences: it is issued by the lease while
// the grant is held (the grant, numbered in holdRare.grant, is checked to be
// the hold's current one and not lost both before and after the lease's
// NextToken), so it is greater than the token of every grant that ended
// before this one began, whether that token was read or not, and smaller
// than the token of every grant that begins after this one ends. A grant
// that was lost or released before anybody read its token never gets one
// (it shows as 0): a late reading cannot hand a lost holder a token newer
// than its successor's.
//
// # Locking
//
// Nothing is held across NextToken. The first reader of a due token marks
// the hold as issuing (holdRare.issuing, under mu) and calls the lease; other
// readers of that hold wait on the channel, readers of other holds do not
// wait at all. One issuance is bounded by tokenTimeout: a backing file that
// some other program keeps locked (the local backend polls its OFD lock)
// makes that reading show 0 and log why, and the next reading tries again.

// tokenIssueTimeout bounds the issuance of one deferred token.
const tokenIssueTimeout = 5 * time.Second

// dueToken is a grant whose token is due, with the lease to ask for it.
type dueToken struct {
	ls    *lockState
	h     *hold
	grant uint64
	lease Lease
}

// owesToken reports whether h's current grant still waits for its token:
// deferred, not read yet, explicit and not lost. (A hold whose explicit
// part was released while it stays for a lock below keeps tokenDue until
// its next grant, which numbers it anew: only explicit grants have tokens.)
// GUARDED_BY(Engine.mu)
func (h *hold) owesToken() bool {
	return h.rare != nil && h.rare.tokenDue && h.explicit != 0 && h.lostErr() == nil
}

// dueOf is h's current grant on ls as a dueToken.
func dueOf(ls *lockState, h *hold) dueToken {
	return dueToken{ls: ls, h: h, grant: h.rareOf().grant, lease: ls.lease}
}

// dueLocked appends ls's grants whose token is due to out.
func (e *Engine) dueLocked(ls *lockState, out []dueToken) []dueToken {
	if ls.lease == nil {
		return out
	}
	for _, h := range ls.holds.all() {
		if h.owesToken() {
			out = append(out, dueOf(ls, h))
		}
	}
	return out
}

// stillDueLocked reports whether d's grant is still the hold's current
// grant and still owes its token.
func stillDueLocked(d dueToken) bool {
	return d.ls.holds.get(d.h.owner) == d.h && d.h.rareOf().grant == d.grant && d.h.owesToken()
}

// issue issues the tokens of due, one after the other.
func (e *Engine) issue(due []dueToken) {
	for _, d := range due {
		e.issueOne(d)
	}
}

// issueOne issues d's token, or waits for the reader that is issuing it.
func (e *Engine) issueOne(d dueToken) {
	e.mu.Lock()
	for {
		if !stillDueLocked(d) {
			e.mu.Unlock()
			return
		}
		ch := d.h.rareOf().issuing
		if ch == nil {
			break
		}
		e.mu.Unlock()
		select {
		case <-ch:
		case <-e.closing:
			return
		}
		e.mu.Lock()
	}
	ch := make(chan struct{})
	d.h.setRare().issuing = ch
	e.mu.Unlock()

	ctx, cancel := context.WithTimeout(e.ctx, e.tokenTimeout)
	tok, err := d.lease.NextToken(ctx)
	cancel()

	e.mu.Lock()
	r := d.h.setRare()
	r.issuing = nil
	warn := false
	switch {
	case !stillDueLocked(d):
		err = nil // the grant ended meanwhile: its token is nobody's
	case err == nil:
		r.token, r.tokenDue = tok, false
	case e.ctx.Err() != nil:
		// Closing: no reading comes after this one.
	case errors.Is(err, context.DeadlineExceeded):
		// Still due: the next reading tries again.
		warn, r.tokenWarned = !r.tokenWarned, true
	default:
		r.tokenDue = false // it reads 0 from now on
		warn, r.tokenWarned = !r.tokenWarned, true
	}
	pid := d.h.lineage.Self().PID
	e.mu.Unlock()
	close(ch)
	if warn {
		e.log.WithError(err).WithFields(map[string]any{
			"path": d.ls.id.String(), "kind": d.ls.id.Kind.String(), "pid": pid,
		}).Warn("fencing token not issued: the holder's token reads 0")
	}
}

// Token returns the fencing token of owner's explicit hold on id, issuing
// it first if its grant deferred it. It fails with ErrNotHeld if owner
// holds id only implicitly or not at all, with the hold's loss if it was
// lost before its token was issued, and if the token cannot be issued.
func (e *Engine) Token(id LockID, owner Owner) (uint64, error) {
	if p, err := CleanPath(id.Path); err == nil {
		id.Path = p
	}
	for tries := 0; ; tries++ {
		e.mu.Lock()
		var h *hold
		ls := e.locks[id]
		if ls != nil {
			h = ls.holds.get(owner)
		}
		switch {
		case h == nil || h.explicit == 0:
			e.mu.Unlock()
			return 0, fmt.Errorf("token of %s: %w", id, ErrNotHeld)
		case !h.rareOf().tokenDue:
			tok := h.rareOf().token
			e.mu.Unlock()
			if tok == 0 {
				return 0, fmt.Errorf("token of %s: none was issued (see the log)", id)
			}
			return tok, nil
		case h.lostErr() != nil:
			err := h.lostErr()
			e.mu.Unlock()
			return 0, fmt.Errorf("token of %s: %w", id, err)
		case ls.lease == nil:
			e.mu.Unlock()
			return 0, fmt.Errorf("token of %s: no lease: %w", id, ErrLeaseLost)
		case e.closed:
			e.mu.Unlock()
			return 0, fmt.Errorf("token of %s: %w", id, ErrClosed)
		case tries > 0 && h.rareOf().tokenWarned:
			e.mu.Unlock()
			return 0, fmt.Errorf("token of %s: not issued in %v (see the log)", id, e.tokenTimeout)
		}
		d := dueOf(ls, h)
		e.mu.Unlock()
		e.issueOne(d)
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
