package lockmgr

// The per-lock FIFO queue (SPEC §2.7), built so that a release costs
// O(waiters it lets in), not O(waiters):
//
//   - Each waiter sleeps on its own channel. A change wakes only the
//     waiters it may let in: the head, and the shared waiters before the
//     first exclusive one (wakeFrontLocked). Nobody polls.
//   - FIFO is checked in O(1): an exclusive waiter goes only from the
//     head; a shared one goes if no exclusive waiter arrived before it
//     (firstX, by arrival number).
//   - A waiter leaving the queue wakes those it held back: the next head,
//     or the shared waiters behind it when it was the first exclusive one.
//   - A waiter whose lineage comes to hold the lock may jump the queue
//     (privilegedLocked). The waiters are indexed by the processes of
//     their lineages (ls.under, procWaiters) and by owner (ls.byOwner),
//     so that a hold of process p looks only at the waiters it may let
//     in: those p is an ancestor of, and those of p's own threads whose
//     step the hold does not block (wakeLetInLocked). A grant to one of
//     10,000 queued threads of one process looks at none of the others.
//     A change of who a hold belongs to (a process exit, heirs.go) wakes
//     the whole queue, once.

// enqueueLocked appends a waiter for step s of rc to ls's queue.
func (e *Engine) enqueueLocked(ls *lockState, s step, rc *reqCtx) *waiter {
	ls.seq++
	w := &waiter{step: s, rc: rc, since: e.now(), seq: ls.seq, wake: make(chan struct{}, 1), wakes: &e.wakes}
	w.prev = ls.tail
	if ls.tail != nil {
		ls.tail.next = w
	} else {
		ls.head = w
	}
	ls.tail = w
	if s.mode == Exclusive && ls.firstX == nil {
		ls.firstX = w
	}
	ls.indexLocked(w, true)
	e.waiting[rc.req.TID] = w
	return w
}

// queueLenLocked is the length of ls's queue, counted: only status and
// metrics ask, and a counter would cost every lock's table entry a word.
func (ls *lockState) queueLenLocked() int {
	n := 0
	for w := ls.head; w != nil; w = w.next {
		n++
	}
	return n
}

// procWaiters are the waiters of one lock whose lineage contains process
// p, sorted by what a hold of p does to them (exemptLocked): a hold of p
// exempts p's descendants (below) and p's own implicit steps (implicit);
// an explicit shared hold blocks no shared step of p's threads (shared);
// an explicit exclusive hold blocks every explicit step of p's threads
// through another owner (exclusive).
type procWaiters struct {
	n                                  int
	below, implicit, shared, exclusive waiterSet
}

// waiterSet is a set of waiters; nil is empty.
type waiterSet map[*waiter]struct{}

func (s *waiterSet) add(w *waiter) {
	if *s == nil {
		*s = make(waiterSet)
	}
	(*s)[w] = struct{}{}
}

// signalAll wakes every waiter of s and returns how many it looked at.
func (s waiterSet) signalAll() uint64 {
	for w := range s {
		w.signal()
	}
	return uint64(len(s))
}

// setOf returns the set of pw that holds w, whose lineage has p at i.
func (pw *procWaiters) setOf(w *waiter, i int) *waiterSet {
	switch {
	case i > 0:
		return &pw.below
	case !w.step.explicit:
		return &pw.implicit
	case w.step.mode == Shared:
		return &pw.shared
	}
	return &pw.exclusive
}

// indexLocked adds w to ls.under and ls.byOwner (add), or removes it.
func (ls *lockState) indexLocked(w *waiter, add bool) {
	owner := w.rc.req.Owner
	if add {
		if ls.byOwner == nil {
			ls.byOwner = make(map[Owner][]*waiter)
		}
		ls.byOwner[owner] = append(ls.byOwner[owner], w)
	} else {
		same := ls.byOwner[owner]
		for i, q := range same {
			if q == w {
				same = append(same[:i], same[i+1:]...)
				break
			}
		}
		if len(same) == 0 {
			delete(ls.byOwner, owner)
		} else {
			ls.byOwner[owner] = same
		}
	}
	for i, p := range w.rc.lineage {
		if p.PID == 1 {
			continue
		}
		pw := ls.under[p]
		if add {
			if pw == nil {
				if ls.under == nil {
					ls.under = make(map[ProcID]*procWaiters)
				}
				pw = &procWaiters{}
				ls.under[p] = pw
			}
			pw.n++
			pw.setOf(w, i).add(w)
			continue
		}
		if pw == nil {
			continue
		}
		delete(*pw.setOf(w, i), w)
		if pw.n--; pw.n <= 0 {
			delete(ls.under, p)
		}
	}
}

// dequeueLocked removes w from ls's queue and wakes the waiters that it
// held back.
func (e *Engine) dequeueLocked(ls *lockState, w *waiter) {
	if e.waiting[w.rc.req.TID] == w {
		delete(e.waiting, w.rc.req.TID)
	}
	if w.prev == nil && ls.head != w {
		return // not queued (any more)
	}
	wasHead, wasFirstX := ls.head == w, ls.firstX == w
	next := w.next
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		ls.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		ls.tail = w.prev
	}
	w.prev, w.next = nil, nil
	ls.indexLocked(w, false)
	if wasFirstX {
		ls.firstX = nil
		for q := next; q != nil; q = q.next {
			if q.step.mode == Exclusive {
				ls.firstX = q
				break
			}
		}
		// The shared waiters between w and the next exclusive one no
		// longer wait behind an exclusive waiter.
		for q := next; q != nil && q != ls.firstX; q = q.next {
			q.signal()
		}
	}
	if wasHead && ls.head != nil {
		ls.head.signal()
	}
}

// signal wakes w unless a wake-up is already pending: its goroutine, or
// its parked request (park.go). Called under Engine.mu.
func (w *waiter) signal() {
	w.signalled = true
	select {
	case w.wake <- struct{}{}:
		*w.wakes++ // set with wake by enqueueLocked
	default:
	}
	if a := w.parked; a != nil {
		w.parked = nil
		a.wakeLocked()
	}
}

// wakeFrontLocked wakes the waiters that FIFO lets go now: the head, and
// every shared waiter before the first exclusive one.
func (ls *lockState) wakeFrontLocked() {
	if ls.head == nil {
		return
	}
	ls.head.signal()
	if ls.head.step.mode == Exclusive {
		return
	}
	// The head is shared: so is every waiter up to firstX.
	for q := ls.head.next; q != nil && q != ls.firstX; q = q.next {
		q.signal()
	}
}

// notifyLocked wakes the requests that sleep on ls.changed: those waiting
// for a backend call to end, Close and Break. Call it when the lease or
// busy change; holds that go away call broadcastLocked.
func (ls *lockState) notifyLocked() {
	if ls.changed != nil {
		close(ls.changed)
		ls.changed = nil
	}
}

// broadcastLocked is notifyLocked plus a wake-up of the queued waiters
// that a hold going away (or weakening) may let in: the front of the
// queue (queue.go).
func (ls *lockState) broadcastLocked() {
	ls.notifyLocked()
	ls.wakeFrontLocked()
}

// broadcastLocked is lockState.broadcastLocked plus a wake-up of the
// waiters that may jump the queue (privilegedLocked): those whose lineage
// holds the lock, which the front need not include, and that the hold
// does not block. Looked for only among the holds' processes that some
// waiter descends from (ls.under).
func (e *Engine) broadcastLocked(ls *lockState) {
	ls.broadcastLocked()
	if ls.head == nil || len(ls.under) == 0 {
		return
	}
	for _, h := range ls.holds.all() {
		if h.lostErr() != nil {
			continue
		}
		procs, inherited := e.procsLocked(h)
		for _, p := range procs {
			if wakeByScan {
				e.wakeUnderLocked(ls, p)
			} else {
				e.wakeLetInLocked(ls, p, h, inherited)
			}
		}
	}
}

// changedLocked returns the channel that the next change of ls closes.
func (ls *lockState) changedLocked() chan struct{} {
	if ls.changed == nil {
		ls.changed = make(chan struct{})
	}
	return ls.changed
}

// wakeAllLocked wakes every waiter of ls, for changes that may exempt any
// of them (a hold's processes changed).
func (ls *lockState) wakeAllLocked() {
	ls.notifyLocked()
	for q := ls.head; q != nil; q = q.next {
		q.signal()
	}
}

// wakeUnderHoldLocked wakes the waiters of ls that descend from p (or are
// p), which hold h, new or stronger, of p may let jump the queue; not
// those that h itself blocks (a thread of p waiting through another open
// file description of the same control file): h lets none of them in.
func (e *Engine) wakeUnderHoldLocked(ls *lockState, p ProcID, h *hold) {
	if ls.under[p] == nil {
		return
	}
	if wakeByScan {
		e.wakeUnderHoldByScanLocked(ls, p, h)
		return
	}
	procs, inherited := e.procsLocked(h)
	if len(procs) != 1 || procs[0] != p {
		// h belongs to another process than the one that added to it
		// (an implicit step of a descriptor's new user): look at all
		// of p's waiters, as before.
		e.wakeUnderLocked(ls, p)
		return
	}
	e.wakeLetInLocked(ls, p, h, inherited)
}

// wakeLetInLocked wakes the waiters whose lineage contains p that hold h,
// which belongs to p (as an heir if inherited), does not block
// (blockedByHoldsLocked, exemptLocked): a superset of those h may let
// jump the queue, found without looking at the others.
func (e *Engine) wakeLetInLocked(ls *lockState, p ProcID, h *hold, inherited bool) {
	pw := ls.under[p]
	if pw == nil {
		return
	}
	e.examined += pw.below.signalAll() // descendants: exempt
	e.examined += pw.implicit.signalAll()
	switch {
	case inherited || h.explicit == 0 || h.mode() == 0:
		// Exempt (an heir's hold, an implicit one), or not in force.
		e.examined += pw.shared.signalAll()
		e.examined += pw.exclusive.signalAll()
		return
	case h.mode() == Shared:
		e.examined += pw.shared.signalAll()
	}
	// A thread waiting through h's own owner (one open file description)
	// is not blocked by it.
	for _, q := range ls.byOwner[h.owner] {
		e.examined++
		if q.rc.lineage.Contains(p) {
			q.signal()
		}
	}
}

// wakeUnderHoldByScanLocked is wakeUnderHoldLocked as it was: it looks at
// every waiter of the queue. For a test's control only (wakeByScan).
func (e *Engine) wakeUnderHoldByScanLocked(ls *lockState, p ProcID, h *hold) {
	for q := ls.head; q != nil; q = q.next {
		e.examined++
		if !q.rc.lineage.Contains(p) {
			continue
		}
		if !wakeBlockedUnder && h.owner != q.rc.req.Owner && Conflicts(h.mode(), q.step.mode) && !e.exemptLocked(h, q.step, q.rc) {
			continue
		}
		q.signal()
	}
}

// wakeBlockedUnder makes wakeUnderHoldLocked wake the waiters that the
// hold blocks too, as it did before. A variable only for a test's control.
var wakeBlockedUnder = false

// wakeByScan makes wakeUnderHoldLocked look through the whole queue, as
// it did before the waiters were indexed. A variable only for a test's
// control.
var wakeByScan = false

// wakeUnderLocked wakes every waiter of ls that descends from p (or is p).
func (e *Engine) wakeUnderLocked(ls *lockState, p ProcID) {
	pw := ls.under[p]
	if pw == nil {
		return
	}
	e.examined += pw.below.signalAll() + pw.implicit.signalAll() + pw.shared.signalAll() + pw.exclusive.signalAll()
}
