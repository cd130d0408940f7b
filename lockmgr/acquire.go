package lockmgr

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// A request's life, top down: Acquire and AcquireAsync validate it; acquire
// and AcquireAsync read the requester's lineage, apply the usage rule, turn
// a second request of an owner into a conversion (convert.go) and make the
// plan. grant.go takes its steps one by one (waiting in wait.go, or, for
// AcquireAsync, parked: park.go) and gives the grant its fencing token, or
// records it as due (tokens.go). Release is release.go.

// Request asks for one lock.
type Request struct {
	// Lock is the lock asked for.
	Lock LockID
	// Mode is Shared or Exclusive.
	Mode Mode
	// Owner is the kernel lock owner the request comes from.
	Owner Owner
	// TID is the requesting thread (FUSE Header.Pid). The engine resolves
	// it to a process and its ancestors.
	TID int
	// UID is the requester's user id, shown in status.
	UID uint32
	// Wait: block until granted (LockWait), or fail with ErrWouldBlock.
	Wait bool
	// Ino is the inode number of the control file as processes see it
	// (st_ino), or 0 if unknown. When the requesting process exits while
	// its flock hold remains, the engine looks for the processes that
	// still hold a descriptor of this file: the hold is theirs (heirs.go).
	Ino uint64
	// DeferToken: the grant's fencing token is issued when it is first
	// read (Status, SnapshotTokens, Token), not by Acquire, whose Grant
	// then carries 0. A lock that nobody asks the token of costs the
	// backend no token at all (the local backend: no read and write of the
	// backing file per grant). The token is still issued while the hold
	// is held, so it is greater than every token read before it.
	DeferToken bool
}

// Grant is the answer to a successful Acquire.
type Grant struct {
	// Token is the fencing token of the grant: strictly greater than every
	// earlier grant's token on this lock. 0 if the request deferred it
	// (Request.DeferToken).
	Token uint64
}

// validate checks a request's shape.
func (r *Request) validate() error {
	switch r.Mode {
	case Shared, Exclusive:
	default:
		return fmt.Errorf("mode %d: %w", r.Mode, ErrInvalid)
	}
	switch r.Lock.Kind {
	case KindDir, KindNewDir:
	case KindUsage:
		if r.Mode != Exclusive {
			return fmt.Errorf("usage lock is exclusive only: %w", ErrInvalid)
		}
	default:
		return fmt.Errorf("lock kind %d: %w", r.Lock.Kind, ErrInvalid)
	}
	p, err := CleanPath(r.Lock.Path)
	if err != nil {
		return fmt.Errorf("%v: %w", err, ErrInvalid)
	}
	r.Lock.Path = p
	return nil
}

// plan lists the steps of a request, root first: a shared directory hold on
// every proper ancestor, D's own directory lock for the newdir and usage
// kinds, then the lock itself.
func plan(id LockID, mode Mode) []step {
	n := 2 + strings.Count(id.Path, "/")
	if id.Path != "." {
		n++
	}
	steps := make([]step, 0, n)
	if id.Path != "." {
		steps = append(steps, step{id: LockID{Path: ".", Kind: KindDir}, mode: Shared})
		for i := 0; i < len(id.Path); i++ {
			if id.Path[i] == '/' {
				steps = append(steps, step{id: LockID{Path: id.Path[:i], Kind: KindDir}, mode: Shared})
			}
		}
	}
	if id.Kind != KindDir {
		steps = append(steps, step{id: LockID{Path: id.Path, Kind: KindDir}, mode: Shared})
	}
	return append(steps, step{id: id, mode: mode, explicit: true})
}

// Acquire takes the lock req asks for, with its implicit ancestor holds.
// With req.Wait it blocks until granted or ctx ends; a cancelled wait leaves
// nothing behind and returns ctx.Err(). Errors: ErrWouldBlock, ErrDeadlock,
// ErrInvalid, ErrLeaseLost, ErrUnavailable, ErrClosed, each wrapped with the
// lock and mode. AcquireAsync (below) is the same without a goroutine
// per wait.
func (e *Engine) Acquire(ctx context.Context, req Request) (Grant, error) {
	if err := req.validate(); err != nil {
		return e.invalid(req, err)
	}
	var start time.Time
	if e.obs != nil {
		start = time.Now()
	}
	g, err := e.acquire(ctx, req)
	return e.answered(req, start, g, err)
}

// invalid answers a request that failed validation.
func (e *Engine) invalid(req Request, err error) (Grant, error) {
	if e.obs != nil {
		e.obs.Requested(req, Grant{}, Failed, 0) // a refusal is counted like any other
	}
	return Grant{}, fmt.Errorf("acquire %s %s: %w", req.Mode, req.Lock, err)
}

// answered reports the outcome of a request begun at start to the observer
// and wraps its error.
func (e *Engine) answered(req Request, start time.Time, g Grant, err error) (Grant, error) {
	if e.obs != nil {
		e.obs.Requested(req, g, outcomeOf(err), time.Since(start))
	}
	if err != nil {
		return Grant{}, fmt.Errorf("acquire %s %s: %w", req.Mode, req.Lock, err)
	}
	return g, nil
}

func (e *Engine) acquire(ctx context.Context, req Request) (Grant, error) {
	rc := e.newReqCtx(req)
	e.mu.Lock()
	ls, h, err := e.admitLocked(rc)
	if err != nil {
		e.mu.Unlock()
		return Grant{}, err
	}
	if h != nil {
		return e.convertUnlocksMu(ctx, ls, h, rc)
	}
	steps := plan(req.Lock, req.Mode)
	for i, s := range steps {
		if err := e.stepDropsMu(ctx, s, rc); err != nil {
			e.rollbackDropsMu(steps[:i], req.Owner)
			e.mu.Unlock()
			return Grant{}, err
		}
	}
	e.mu.Unlock()
	return e.issueToken(ctx, req)
}

// AcquireAsync asks for the lock of req as Acquire does and calls answer
// exactly once with what Acquire would have returned. It does not wait for
// the request to sleep in a queue: if the request is answered without
// sleeping there, answer runs on the caller's goroutine before
// AcquireAsync returns; otherwise AcquireAsync returns once the request is
// queued, and answer runs later on a goroutine the engine starts when the
// request is woken (granted, refused, cancelled by ctx, or the engine
// closed). answer is called without the engine's lock held.
func (e *Engine) AcquireAsync(ctx context.Context, req Request, answer func(Grant, error)) {
	if err := req.validate(); err != nil {
		answer(e.invalid(req, err))
		return
	}
	a := &parkedRequest{e: e, ctx: ctx, answer: answer}
	if e.obs != nil {
		a.start = time.Now()
	}
	a.rc = e.newReqCtx(req)
	e.mu.Lock()
	ls, h, err := e.admitLocked(a.rc)
	if err != nil {
		e.mu.Unlock()
		a.finish(Grant{}, err)
		return
	}
	if h != nil {
		a.finish(e.convertUnlocksMu(ctx, ls, h, a.rc))
		return
	}
	a.steps = plan(req.Lock, req.Mode)
	a.runUnlocksMu()
}

// newReqCtx reads the requester's lineage (before mu is taken).
func (e *Engine) newReqCtx(req Request) *reqCtx {
	lin, err := e.procs.Lineage(req.TID)
	if err != nil {
		// The thread is gone (or /proc is unreadable): no lineage, so no
		// exemptions. The request itself is still served.
		e.log.WithError(err).WithField("tid", req.TID).Debug("no lineage for requester")
		lin = nil
	}
	return &reqCtx{req: req, lineage: lin}
}

// admitLocked checks a request before its steps: it is refused (err) if
// the engine is closed or by the usage rule; h is the owner's explicit
// hold on the lock, if it has one (on ls): the request is a conversion
// (convert.go). Otherwise it takes its plan's steps.
func (e *Engine) admitLocked(rc *reqCtx) (ls *lockState, h *hold, err error) {
	if e.closed {
		return nil, nil, ErrClosed
	}
	if err := e.usageRuleLocked(rc); err != nil {
		return nil, nil, err
	}
	if ls := e.locks[rc.req.Lock]; ls != nil {
		if h := ls.holds.get(rc.req.Owner); h != nil && h.explicit != 0 {
			return ls, h, nil
		}
	}
	return nil, nil, nil
}

// usageRuleLocked enforces SPEC §2.4: a process whose lineage holds a usage
// lock may ask only for locks its lineage already holds (in at least the
// mode asked for).
func (e *Engine) usageRuleLocked(rc *reqCtx) error {
	if len(e.usage) == 0 || len(rc.lineage) == 0 {
		return nil
	}
	var held *hold
	for h := range e.usage {
		if h.lostErr() == nil && e.belongsToLineageLocked(h, rc.lineage) {
			held = h
			break
		}
	}
	if held == nil {
		return nil
	}
	if ls := e.locks[rc.req.Lock]; ls != nil {
		for _, h := range ls.holds.all() {
			if h.lostErr() != nil || h.mode() < rc.req.Mode {
				continue
			}
			if h.owner == rc.req.Owner || e.belongsToLineageLocked(h, rc.lineage) {
				return nil
			}
		}
	}
	return fmt.Errorf("a usage lock is held by this process or an ancestor: %w", ErrDeadlock)
}
