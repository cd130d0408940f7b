package lockmgr

import (
	"context"
	"sort"
	"time"
)

// Holder describes one owner's hold on a lock.
type Holder struct {
	Owner Owner
	// Mode is the explicit mode; 0 if the owner holds the lock only on
	// behalf of locks below it.
	Mode Mode
	// Explicit: the owner asked for this very lock.
	Explicit bool
	// Implicit counts the owner's holds taken on behalf of other locks.
	Implicit int
	// Process is the process the hold belongs to now (after lineage
	// passing); TID the thread that took it.
	Process ProcID
	TID     int
	UID     uint32
	Host    string
	Since   time.Time
	// Token is the grant's fencing token: 0 if it was never issued (a
	// grant that deferred it, shown by Snapshot before anybody read it,
	// or one whose issuance failed, which the log says).
	Token uint64
	// Lost is non-nil once the hold's lease was lost or broken.
	Lost error
}

// Waiter describes a queued request.
type Waiter struct {
	Owner   Owner
	Mode    Mode
	Process ProcID
	TID     int
	UID     uint32
	Since   time.Time
	// Implicit: the waiter waits for an ancestor hold of a lock below.
	Implicit bool
	// Wants and WantsMode are the lock and mode the request asked for: the
	// lock the waiter is queued on itself, or for an implicit waiter a lock
	// below it (a/b/.lock waits on a's queue for its shared hold of a).
	Wants     LockID
	WantsMode Mode
	// Outside: the request waits for the backend's claim, held by someone
	// outside this engine (Blocker says who, as far as the backend knows),
	// not for a holder of this daemon.
	Outside bool
	Blocker string
}

// BlockerDescriber is implemented by backends that can say who holds a
// claim outside the engine, for the status of requests waiting for it.
type BlockerDescriber interface {
	Blocker() string
}

// LockStatus is a snapshot of one lock.
type LockStatus struct {
	Lock LockID
	// Mode is the strongest mode held.
	Mode Mode
	// Holders lists the owners holding the lock explicitly, and those
	// holding it only implicitly, explicit ones first.
	Holders []Holder
	// Implicit is the number of implicit holds from below.
	Implicit int
	Waiters  []Waiter
	// Lease describes the backend's claim, "" if none; it ends in
	// " yielding" while Yielding.
	Lease string
	// Yielding: someone outside this engine waits for the lock, so the
	// lease goes to no new local request and is given up when the holds
	// running end (lease.go).
	Yielding bool
}

// holderLocked renders h.
func (e *Engine) holderLocked(ls *lockState, h *hold) Holder {
	p := h.lineage.Self()
	if procs, _ := e.procsLocked(h); len(procs) > 0 {
		p = procs[0]
	}
	return Holder{
		Owner: h.owner, Mode: h.explicit, Explicit: h.explicit != 0, Implicit: int(h.implicit),
		Process: p, TID: int(h.tid), UID: h.uid, Host: e.host, Since: h.sinceTime(), Token: h.rareOf().token, Lost: h.lostErr(),
	}
}

// statusLocked renders ls, except its lease: describing a lease is a call
// into the backend, made without mu (describeLease).
func (e *Engine) statusLocked(ls *lockState) (LockStatus, Lease) {
	st := LockStatus{Lock: ls.id, Mode: ls.heldModeLocked(), Yielding: ls.lease != nil && e.yieldingLocked(ls)}
	for _, h := range ls.holds.all() {
		st.Holders = append(st.Holders, e.holderLocked(ls, h))
		st.Implicit += int(h.implicit)
	}
	sort.Slice(st.Holders, func(i, j int) bool {
		a, b := st.Holders[i], st.Holders[j]
		if a.Explicit != b.Explicit {
			return a.Explicit
		}
		return a.Since.Before(b.Since)
	})
	for w := ls.head; w != nil; w = w.next {
		if _, out := ls.outside[w]; out {
			continue // shown below
		}
		st.Waiters = append(st.Waiters, Waiter{
			Owner: w.rc.req.Owner, Mode: w.step.mode, Process: w.rc.lineage.Self(), TID: w.rc.req.TID,
			UID: w.rc.req.UID, Since: w.since, Implicit: !w.step.explicit,
			Wants: w.rc.req.Lock, WantsMode: w.rc.req.Mode,
		})
	}
	if len(ls.outside) > 0 {
		blocker := "a holder outside this daemon (the backend's claim)"
		if d, ok := e.backend.(BlockerDescriber); ok {
			blocker = d.Blocker()
		}
		var outside []Waiter
		for w := range ls.outside {
			outside = append(outside, Waiter{
				Owner: w.rc.req.Owner, Mode: w.step.mode, Process: w.rc.lineage.Self(), TID: w.rc.req.TID,
				UID: w.rc.req.UID, Since: w.since, Implicit: !w.step.explicit,
				Wants: w.rc.req.Lock, WantsMode: w.rc.req.Mode, Outside: true, Blocker: blocker,
			})
		}
		sort.Slice(outside, func(i, j int) bool { return outside[i].Since.Before(outside[j].Since) })
		st.Waiters = append(st.Waiters, outside...)
	}
	return st, ls.lease
}

// describeLease fills st.Lease from lease, without engine locks.
func describeLease(st *LockStatus, lease Lease) {
	if lease == nil {
		return
	}
	st.Lease = lease.Mode().String()
	if d, ok := lease.(LeaseDescriber); ok {
		st.Lease = d.Describe()
	}
	if st.Yielding {
		st.Lease += " yielding"
	}
}

// Status returns a snapshot of one lock; a lock nobody holds or waits for
// has no holders and no waiters. A grant that deferred its token
// (Request.DeferToken) and that nobody read yet shows token 0; StatusTokens
// issues such tokens first.
func (e *Engine) Status(id LockID) LockStatus {
	if p, err := CleanPath(id.Path); err == nil {
		id.Path = p
	}
	e.mu.Lock()
	ls := e.locks[id]
	if ls == nil {
		e.mu.Unlock()
		return LockStatus{Lock: id}
	}
	st, lease := e.statusLocked(ls)
	e.mu.Unlock()
	describeLease(&st, lease)
	return st
}

// StatusTokens is Status with the fencing tokens that grants deferred and
// nobody read yet issued first (tokens.go): what a reader of the lock's
// status is shown. A grant made while they are issued is issued in a next
// round, up to two; one made during the last round, or one whose token
// could not be issued (logged), shows token 0 until the next reading.
func (e *Engine) StatusTokens(id LockID) LockStatus {
	if p, err := CleanPath(id.Path); err == nil {
		id.Path = p
	}
	tried := map[uint64]bool{}
	for round := 0; round < 3; round++ {
		e.mu.Lock()
		var due []dueToken
		if ls := e.locks[id]; ls != nil {
			for _, d := range e.dueLocked(ls, nil) {
				if !tried[d.grant] {
					tried[d.grant] = true
					due = append(due, d)
				}
			}
		}
		e.mu.Unlock()
		if len(due) == 0 {
			break
		}
		e.issue(due)
	}
	return e.Status(id)
}

// Claims returns every host's claims on id as the backend shows them (see
// ClaimLister), or nil if the backend keeps no such list.
// It asks the backend, so it may make a request: status reads call it,
// lock calls do not.
func (e *Engine) Claims(ctx context.Context, id LockID) ([]ClaimRecord, error) {
	cl, ok := e.backend.(ClaimLister)
	if !ok {
		return nil, nil
	}
	if p, err := CleanPath(id.Path); err == nil {
		id.Path = p
	}
	return cl.ListClaims(ctx, id)
}

// Snapshot returns the status of every lock held or waited for, by path.
// Tokens that grants deferred and nobody read yet show as 0
// (SnapshotTokens issues them).
// It copies the table under Engine.mu, in time linear in its size, and
// asks the leases for their descriptions after releasing it, so that a
// metrics scrape never holds up lock requests for a backend.
func (e *Engine) Snapshot() []LockStatus {
	return e.snapshot(func(ls *lockState) bool { return ls.holds.len() > 0 || ls.head != nil || len(ls.outside) > 0 })
}

// SnapshotWaited is Snapshot of the locks that have waiters (queued, or
// waiting for the backend's claim) only. It walks the table under
// Engine.mu but copies only those, so that a watch of long waits that
// reads it every second costs a daemon holding 100,000 locks next to
// nothing: Snapshot copied every holder of each (each lock's ancestors
// list one holder per lock below), about 3 KiB of garbage per held lock
// each time.
func (e *Engine) SnapshotWaited() []LockStatus {
	return e.snapshot(func(ls *lockState) bool { return ls.head != nil || len(ls.outside) > 0 })
}

// Tally is the table counted the way a metrics scrape reports it.
type Tally struct {
	// Held counts the explicit holds not lost, by lock kind and mode: the
	// holders Snapshot lists with Explicit set and Lost nil.
	Held map[KindMode]int
	// Waiting counts the waiters by lock kind, each once, as Snapshot
	// lists them: queued, waiting for the backend's claim, or both.
	Waiting map[Kind]int
}

// KindMode is a kind of lock and a mode.
type KindMode struct {
	Kind Kind
	Mode Mode
}

// Tally counts what Snapshot would list, from the counts each lock
// keeps: it walks the table under Engine.mu but copies nothing of it, so
// that a metrics scrape of a daemon holding 100,000 locks makes no
// garbage per lock (Snapshot copies every holder of each, and each
// lock's ancestors list one holder per lock below).
func (e *Engine) Tally() Tally {
	t := Tally{Held: map[KindMode]int{}, Waiting: map[Kind]int{}}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ls := range e.locks {
		if ls.nExplicit > 0 {
			t.Held[KindMode{ls.id.Kind, Exclusive}] += int(ls.nExplicitExclusive)
			t.Held[KindMode{ls.id.Kind, Shared}] += int(ls.nExplicit - ls.nExplicitExclusive)
		}
		if n := ls.queueLenLocked() + len(ls.outside); n > 0 {
			for w := range ls.outside {
				if ls.head == w || w.prev != nil {
					n-- // queued too: counted once
				}
			}
			t.Waiting[ls.id.Kind] += n
		}
	}
	return t
}

// snapshot is Snapshot of the locks pick keeps.
func (e *Engine) snapshot(pick func(*lockState) bool) []LockStatus {
	e.mu.Lock()
	out, leases := make([]LockStatus, 0), []Lease(nil)
	for _, ls := range e.locks {
		if !pick(ls) {
			continue
		}
		st, lease := e.statusLocked(ls)
		out = append(out, st)
		leases = append(leases, lease)
	}
	e.mu.Unlock()
	for i := range out {
		describeLease(&out[i], leases[i])
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Lock.Path != out[j].Lock.Path {
			return out[i].Lock.Path < out[j].Lock.Path
		}
		return out[i].Lock.Kind < out[j].Lock.Kind
	})
	return out
}

// Query answers F_GETLK: a holder that would make req wait, on the lock
// itself or on one of its implicit ancestor holds; false if req could be
// granted now as far as this host's processes are concerned.
func (e *Engine) Query(req Request) (Holder, bool) {
	if err := req.validate(); err != nil {
		return Holder{}, false
	}
	lin, _ := e.procs.Lineage(req.TID)
	rc := &reqCtx{req: req, lineage: lin}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range plan(req.Lock, req.Mode) {
		ls := e.locks[s.id]
		if ls == nil {
			continue
		}
		for _, h := range ls.holds.all() {
			if h.owner == req.Owner || !Conflicts(h.mode(), s.mode) || e.exemptLocked(h, s, rc) {
				continue
			}
			return e.holderLocked(ls, h), true
		}
	}
	return Holder{}, false
}
