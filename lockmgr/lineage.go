package lockmgr

import "fmt"

// This file holds the lineage rule (SPEC §2.3) and the usage rule (§2.4).
//
// A lock belongs to the process that took it. If that process has exited
// while the lock is still held (its descriptor lives on in other
// processes), the lock belongs to its parent, and so on up the lineage
// recorded when the hold began. A request never waits for a hold that
// belongs to a proper ancestor of the requesting process. Within one
// process, holds of different owners do not conflict either, with one
// exception that keeps kernel semantics: two explicit holds of one control
// file, both taken by that process itself (two open file descriptions, or a
// flock and an fcntl lock), conflict.

// effectiveProcLocked returns the process a hold belongs to now: the first
// process of its recorded lineage that is still alive; the zero ProcID if
// none is. The lock never passes to init (pid 1): init is everyone's
// ancestor, and an orphaned descriptor must not become everyone's lock.
func (e *Engine) effectiveProcLocked(h *hold) (p ProcID, inherited bool) {
	for i, q := range h.lineage {
		if q.PID == 1 {
			break
		}
		if e.procs.Alive(q) {
			return q, i > 0
		}
	}
	return ProcID{}, false
}

// exemptLocked reports whether the request rc may ignore hold h at step s
// because of lineage.
func (e *Engine) exemptLocked(h *hold, s step, rc *reqCtx) bool {
	if len(rc.lineage) == 0 {
		return false
	}
	p, inherited := e.effectiveProcLocked(h)
	if p == (ProcID{}) {
		return false
	}
	if p == rc.lineage.Self() {
		// Same process: only its own two explicit holds of one control
		// file conflict, as two open file descriptions do in the kernel.
		return inherited || !s.explicit || h.explicit == 0
	}
	return rc.lineage[1:].Contains(p)
}

// privilegedLocked reports whether rc's own owner or lineage already holds
// ls: then it does not queue behind other waiters (they may be waiting for
// that very hold, and queueing would deadlock a child behind its parent).
func (e *Engine) privilegedLocked(ls *lockState, rc *reqCtx) bool {
	if h := ls.holds[rc.req.Owner]; h != nil && h.lost == nil {
		return true
	}
	if len(rc.lineage) == 0 {
		return false
	}
	for _, h := range ls.holds {
		if h.lost != nil {
			continue
		}
		if p, _ := e.effectiveProcLocked(h); p != (ProcID{}) && rc.lineage.Contains(p) {
			return true
		}
	}
	return false
}

// grantableLocked reports whether step s of rc can be granted now as far as
// this host's processes are concerned. If not, it returns the threads the
// step waits for (for deadlock detection). w is rc's own queue entry, if it
// is queued.
func (e *Engine) grantableLocked(ls *lockState, s step, rc *reqCtx, w *waiter) (blockers []int, ok bool) {
	blockers, ok, _ = e.grantableWhyLocked(ls, s, rc, w)
	return blockers, ok
}

// grantableWhyLocked is grantableLocked that also says whether a blocking
// hold may pass to one of rc's own processes when its holder exits (the
// holder descends from rc's lineage): no request tells the engine of such
// an exit, so the waiter must look again from time to time.
func (e *Engine) grantableWhyLocked(ls *lockState, s step, rc *reqCtx, w *waiter) (blockers []int, ok, mayPass bool) {
	if s.mode == Exclusive || ls.nExclusive > 0 {
		for _, h := range ls.holds {
			if h.owner == rc.req.Owner || !Conflicts(h.mode(), s.mode) {
				continue
			}
			if e.exemptLocked(h, s, rc) {
				continue
			}
			blockers = append(blockers, e.holderThreadLocked(h))
			if !mayPass {
				for _, q := range h.lineage {
					if q.PID != 1 && rc.lineage.Contains(q) {
						mayPass = true
						break
					}
				}
			}
		}
		if len(blockers) > 0 {
			return blockers, false, mayPass
		}
	}
	// FIFO: wait behind every earlier waiter whose mode conflicts with
	// ours; shared waiters behind shared waiters go together.
	for _, q := range ls.queue {
		if q == w {
			break
		}
		if Conflicts(q.step.mode, s.mode) {
			blockers = append(blockers, q.rc.req.TID)
		}
	}
	if len(blockers) > 0 && e.privilegedLocked(ls, rc) {
		return nil, true, false
	}
	return blockers, len(blockers) == 0, false
}

// holderThreadLocked names the thread a hold waits on for deadlock
// detection: the thread that took it, or, once the lock has passed up the
// lineage, the main thread of the process that has it now.
func (e *Engine) holderThreadLocked(h *hold) int {
	p, inherited := e.effectiveProcLocked(h)
	if inherited {
		return p.PID
	}
	return h.tid
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
		if h.lost != nil {
			continue
		}
		if p, _ := e.effectiveProcLocked(h); p != (ProcID{}) && rc.lineage.Contains(p) {
			held = h
			break
		}
	}
	if held == nil {
		return nil
	}
	if ls := e.locks[rc.req.Lock]; ls != nil {
		for _, h := range ls.holds {
			if h.lost != nil || h.mode() < rc.req.Mode {
				continue
			}
			if h.owner == rc.req.Owner {
				return nil
			}
			if p, _ := e.effectiveProcLocked(h); p != (ProcID{}) && rc.lineage.Contains(p) {
				return nil
			}
		}
	}
	return fmt.Errorf("a usage lock is held by this process or an ancestor: %w", ErrDeadlock)
}
