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
//     (privilegedLocked). Only a new hold by a process that some waiter
//     descends from (ls.under) makes the engine look through the queue;
//     a change of who a hold belongs to (a process exit, heirs.go) wakes
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
	ls.nQueue++
	if s.mode == Exclusive && ls.firstX == nil {
		ls.firstX = w
	}
	if len(rc.lineage) > 0 {
		if ls.under == nil {
			ls.under = make(map[ProcID]int)
		}
		for _, p := range rc.lineage {
			if p.PID != 1 {
				ls.under[p]++
			}
		}
	}
	e.waiting[rc.req.TID] = w
	return w
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
	ls.nQueue--
	for _, p := range w.rc.lineage {
		if p.PID != 1 {
			if ls.under[p]--; ls.under[p] <= 0 {
				delete(ls.under, p)
			}
		}
	}
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

// signal wakes w unless a wake-up is already pending. Called under
// Engine.mu.
func (w *waiter) signal() {
	w.signalled = true
	select {
	case w.wake <- struct{}{}:
		*w.wakes++ // set with wake by enqueueLocked
	default:
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
// file description of the same control file): h lets none of them in, and
// waking them made a queue of n threads of one process cost O(n) wake-ups
// per grant, O(n²) to drain.
func (e *Engine) wakeUnderHoldLocked(ls *lockState, p ProcID, h *hold) {
	if ls.under[p] == 0 {
		return
	}
	for q := ls.head; q != nil; q = q.next {
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

// wakeUnderLocked wakes the waiters of ls that descend from p (or are p),
// which a new hold of p may let jump the queue.
func (ls *lockState) wakeUnderLocked(p ProcID) {
	if ls.under[p] == 0 {
		return
	}
	for q := ls.head; q != nil; q = q.next {
		if q.rc.lineage.Contains(p) {
			q.signal()
		}
	}
}

// fifoOKLocked reports whether FIFO lets step s (queued as w, or about to
// queue if w is nil) go now: no earlier waiter's mode conflicts with it.
func (ls *lockState) fifoOKLocked(s step, w *waiter) bool {
	if s.mode == Exclusive {
		return ls.head == nil || ls.head == w
	}
	return ls.firstX == nil || (w != nil && ls.firstX.seq > w.seq)
}
