package lockmgr

import (
	"time"
)

// lockState is the engine's table entry for one lock.
type lockState struct {
	id LockID

	// All fields GUARDED_BY(Engine.mu).

	// holds has one entry per owner holding the lock, explicitly, implicitly
	// or both.
	holds holdSet
	// The FIFO of waiters is a doubly linked list from head to tail, so
	// that a waiter leaves it in O(1) (see queue.go); its length is
	// counted when asked (queueLenLocked: status, metrics).
	head, tail *waiter
	// firstX is the earliest exclusive waiter, nil if none: a shared
	// waiter behind it waits, one before it does not (FIFO in O(1)).
	firstX *waiter
	// seq numbers the waiters in arrival order.
	seq uint64
	// under indexes, for every process, the waiters whose lineage
	// contains it (pid 1 aside): a new hold of that process may let them
	// jump the queue (privilegedLocked). byOwner indexes the waiters by
	// owner. See queue.go.
	under   map[ProcID]*procWaiters
	byOwner map[Owner][]*waiter
	// outside holds the requests that wait for the backend's claim: for a
	// holder outside this engine (another daemon, a program locking SOURCE
	// directly, another host), or for another request's claim of it. They
	// may be in the queue too; status shows them once, as outside.
	outside map[*waiter]struct{}
	// lease is the host's claim from the backend; nil if none. Change it
	// only through setLeaseLocked, which resets the give-up state below.
	lease Lease
	// contended is lease's ContendedLease channel, asked for once
	// (askedContended, below) when a local request first waits behind the
	// lease's holds or shares it with them; nil if not asked yet, or if
	// the backend cannot tell (lease.go).
	contended <-chan struct{}
	// unwatch stops the lease's watcher (watchLocked), if it has one.
	unwatch func()
	// changed is closed whenever holds, lease or busy change, to wake the
	// requests that are not queued (they wait for a backend call of
	// another request to end); nil while nobody sleeps on it (see
	// changedLocked). Queued waiters sleep on their own channel instead
	// and are woken one by one (queue.go).
	changed chan struct{}
	// nLive and nExclusive count the holds whose mode() is not 0, and is
	// Exclusive, so that the common cases need not scan holds (the root of
	// a busy tree has one hold per lock below it).
	// nExplicit and nExplicitExclusive count the same for the explicit
	// modes of the holds not lost: what a hierarchical backend's claim
	// must cover.
	// INVARIANT: they match holds; change holds only through change,
	// insert and remove.
	nLive, nExclusive             int32
	nExplicit, nExplicitExclusive int32

	// The flags last, side by side with the counts: a table entry in the
	// 160-byte size class, not 192 (one per held lock; TestLockStateSize).

	askedContended bool
	// yielding: contended was closed: someone outside this engine waits
	// for the lock. The lease is handed to no new request (privileged
	// ones aside) and is released when its holds end (lease.go).
	yielding bool
	// busy: a Claim, Convert or Release of this lock's lease is in flight,
	// and mu was dropped for it. Nobody else touches the lease meanwhile.
	busy bool
	// busyWaits: the in-flight backend call may wait for a long time.
	busyWaits bool
	// settling: the in-flight call is settleDropsMu's downgrade or release,
	// which lowers the lease's mode to settleTo (0: released): until it
	// returns, the lease's Mode may still say the old one, and no hold
	// that needs more than settleTo may be granted on it.
	settling bool
	settleTo Mode
}

func (ls *lockState) count(h *hold, d int32) {
	switch h.mode() {
	case Exclusive:
		ls.nExclusive += d
		ls.nLive += d
	case Shared:
		ls.nLive += d
	}
	if h.lostErr() != nil {
		return
	}
	switch h.explicit {
	case Exclusive:
		ls.nExplicitExclusive += d
		ls.nExplicit += d
	case Shared:
		ls.nExplicit += d
	}
}

// change applies f to h, keeping the counts right.
func (ls *lockState) change(h *hold, f func()) {
	ls.count(h, -1)
	f()
	ls.count(h, 1)
}

// insert adds a new hold.
func (ls *lockState) insert(h *hold) {
	ls.holds.put(h)
	ls.count(h, 1)
}

// remove drops a hold.
func (ls *lockState) remove(h *hold) {
	ls.count(h, -1)
	ls.holds.del(h.owner)
}

// heldModeLocked is the strongest mode any live hold needs.
func (ls *lockState) heldModeLocked() Mode {
	switch {
	case ls.nExclusive > 0:
		return Exclusive
	case ls.nLive > 0:
		return Shared
	}
	return 0
}

// explicitModeLocked is the strongest mode any live explicit hold needs.
func (ls *lockState) explicitModeLocked() Mode {
	switch {
	case ls.nExplicitExclusive > 0:
		return Exclusive
	case ls.nExplicit > 0:
		return Shared
	}
	return 0
}

// hold is one owner's hold on one lock.
//
// A busy host has several per held lock (one on each ancestor, nearly all
// of them implicit only), so the fields an implicit-only hold never or
// seldom sets are kept apart, in holdRare, made on first use; the rest are
// ordered and sized to leave no padding: 96 bytes, a size class of its
// own (docs/BENCHMARKS.md "Held locks"; TestHoldSize).
//
// INVARIANT: explicit != 0 || implicit > 0.
type hold struct {
	owner Owner
	// path and kind are the lock held (lockID), apart so that kind fills
	// padding.
	path string
	// lineage is the taking process and its ancestors when the hold began.
	lineage Lineage
	// since is when the hold began, or its explicit mode last changed
	// (time.Time.UnixNano: 8 bytes where a time.Time takes 24, which keeps
	// a hold in the 96-byte size class); read it through sinceTime.
	since int64
	// ino is the inode number of the control file the hold was taken
	// through (Request.Ino), to find who holds the descriptor once the
	// taking process has exited; 0 if unknown.
	ino uint64
	// rare holds the other fields; nil while they are all zero. Read them
	// through rareOf or lostErr, set them through setRare.
	rare *holdRare
	// implicit counts the holds taken on behalf of other locks; each is shared.
	implicit int32
	// tid is the taking thread (Request.TID; Linux thread ids fit).
	tid  int32
	uid  uint32
	kind Kind
	// explicit is the mode the owner asked for on this very lock; 0 if it
	// holds the lock only on behalf of locks below (or D's own newdir/usage).
	explicit Mode
}

// holdRare is the part of a hold that an explicit grant sets: every
// explicit hold has one (its grant number), an implicit-only hold none.
// What an exit of its taker, a lost lease or a new directory's adoption
// sets, seldom, is further apart (holdFate): a held lock's holdRare is then
// 48 bytes, not 112 (TestHoldSize).
type holdRare struct {
	// token is the grant's fencing token; 0 while tokenDue.
	token uint64
	// grant numbers the hold's current explicit grant (Engine.grants).
	grant uint64
	// issuing is non-nil while a reader issues the grant's deferred
	// token, and closed when it is done; other readers wait for it.
	issuing chan struct{}
	// fate holds the rarer fields; nil while they are all zero. Read them
	// through fateOf or lostErr, set them through setFate.
	fate *holdFate
	// tokenDue: the grant deferred its token (Request.DeferToken) and
	// nobody has read it yet (tokens.go).
	tokenDue bool
	// tokenWarned: a failed issuance of this grant's token was logged.
	tokenWarned bool
}

// holdFate is the part of a hold that an exit of its taker, a lost lease
// or a new directory's adoption sets.
type holdFate struct {
	// heirs are the processes that held the hold's open file description
	// when the taking process exited, as far as a scan could tell: the
	// hold belongs to those still alive (SPEC §2.3, heirs.go). Empty
	// while the taker lives, and when nobody could be named.
	heirs []ProcID
	// adopted lists the new directories whose locks this exclusive
	// new-dir hold's owner was given (AdoptNewDir); released with it.
	adopted []LockID
	// lost is set when the hold's lease was lost or broken: the hold no
	// longer protects anything and conflicts with nobody.
	lost error
	// scanning counts the /proc scans for heirs in flight.
	scanning int32
	// rescans counts the scans made again after one found several
	// candidate descriptions (heirRescans).
	rescans int32
	// scanned: the heirs were looked for since the taker (or the last
	// heir) exited; a hold nobody could be named for is not scanned again.
	scanned bool
}

// lockID is the lock held.
func (h *hold) lockID() LockID { return LockID{Path: h.path, Kind: h.kind} }

// sinceTime is when the hold began, or its explicit mode last changed.
func (h *hold) sinceTime() time.Time { return time.Unix(0, h.since) }

// rareOf returns a copy of h's rare fields, all zero if it has none.
func (h *hold) rareOf() holdRare {
	if h.rare == nil {
		return holdRare{}
	}
	return *h.rare
}

// setRare returns h's rare fields to change, making them if h has none.
func (h *hold) setRare() *holdRare {
	if h.rare == nil {
		h.rare = &holdRare{}
	}
	return h.rare
}

// fateOf returns a copy of h's rarest fields, all zero if it has none.
func (h *hold) fateOf() holdFate {
	if h.rare == nil || h.rare.fate == nil {
		return holdFate{}
	}
	return *h.rare.fate
}

// setFate returns h's rarest fields to change, making them if h has none.
func (h *hold) setFate() *holdFate {
	r := h.setRare()
	if r.fate == nil {
		r.fate = &holdFate{}
	}
	return r.fate
}

// lostErr is h's fate.lost: why the hold was lost, nil if it was not.
func (h *hold) lostErr() error {
	if h.rare == nil || h.rare.fate == nil {
		return nil
	}
	return h.rare.fate.lost
}

// mode is the hold's effective mode for conflicts.
func (h *hold) mode() Mode {
	if h.lostErr() != nil {
		return 0
	}
	if h.implicit > 0 {
		return maxMode(h.explicit, Shared)
	}
	return h.explicit
}

// waiter is a queued step of a blocked request.
type waiter struct {
	step  step
	rc    *reqCtx
	since time.Time
	// seq is the waiter's place in arrival order.
	seq uint64
	// prev and next link the lock's queue.
	prev, next *waiter
	// wake, buffered, is signalled when the waiter may be granted now; it
	// then looks again.
	wake chan struct{}
	// signalled: a wake-up was sent that the waiter has not acted on yet
	// (it clears this once it holds mu again). GUARDED_BY(Engine.mu)
	signalled bool
	// wakes is the engine's count of wake-ups sent (Engine.wakes).
	wakes *uint64
	// parked is the request of AcquireAsync that sleeps here without a
	// goroutine, until a wake-up resumes it (park.go). GUARDED_BY(Engine.mu)
	parked *parkedRequest
}

// step is one lock of a request's plan: the implicit ancestor holds, then
// the explicit lock.
type step struct {
	id       LockID
	mode     Mode
	explicit bool
}

// reqCtx is what the engine knows about a request while it runs.
type reqCtx struct {
	req     Request
	lineage Lineage
}

func newLockState(id LockID) *lockState {
	return &lockState{id: id}
}

// idleLocked: nothing refers to this entry any more.
func (ls *lockState) idleLocked() bool {
	return ls.holds.len() == 0 && ls.head == nil && ls.lease == nil && !ls.busy
}

// lockLocked returns the table entry for id, creating it.
func (e *Engine) lockLocked(id LockID) *lockState {
	ls := e.locks[id]
	if ls == nil {
		ls = newLockState(id)
		e.locks[id] = ls
	}
	return ls
}

// The table's entries change as steps are granted (grant.go calls
// addHoldLocked) and released (release.go, dropHoldLocked).

// addHoldLocked records a granted step. A hold only adds conflicts, so it
// wakes no waiter, except those that descend from its process: they may
// now jump the queue (privilegedLocked).
func (e *Engine) addHoldLocked(ls *lockState, s step, rc *reqCtx) {
	h := ls.holds.get(rc.req.Owner)
	if h == nil {
		h = &hold{owner: rc.req.Owner, path: ls.id.Path, kind: ls.id.Kind, tid: int32(rc.req.TID), uid: rc.req.UID, since: e.now().UnixNano(), ino: rc.req.Ino}
		e.setTakerLocked(h, rc.lineage)
		ls.insert(h)
	}
	if s.explicit {
		if h.explicit != s.mode {
			h.since = e.now().UnixNano()
		}
		ls.change(h, func() { h.explicit = s.mode })
		if f := h.fateOf(); rc.lineage.Self() != h.lineage.Self() || len(f.heirs) > 0 || f.scanned {
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
