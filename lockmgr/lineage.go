package lockmgr

import "fmt"

// This file holds the lineage rule (SPEC §2.3) and the usage rule (§2.4).
//
// A lock belongs to the process that took it. If that process has exited
// while the lock is still held (its descriptor lives on in other
// processes), the lock belongs to the processes that still hold the
// descriptor, as far as the engine can name them (heirs.go); it never
// passes up to the dead process's parent. A request never waits for a hold
// that belongs to a proper ancestor of the requesting process. Within one
// process, holds of different owners do not conflict either, with one
// exception that keeps kernel semantics: two explicit holds of one control
// file, both taken by that process itself (two open file descriptions, or a
// flock and an fcntl lock), conflict.
//
// Whether a process lives is what the engine's exit watches have told it
// (heirs.go): nothing here reads /proc, so it all runs under Engine.mu.

// procsLocked returns the processes hold h belongs to now: the process
// that took it while it lives, else its live heirs (none if nobody could
// be named). inherited says which of the two.
func (e *Engine) procsLocked(h *hold) (procs []ProcID, inherited bool) {
	if len(h.lineage) == 0 {
		return nil, false
	}
	if !e.exitedLocked(h.lineage[0]) {
		return h.lineage[:1], false
	}
	live := h.heirs[:0:0]
	for _, p := range h.heirs {
		if !e.exitedLocked(p) {
			live = append(live, p)
		}
	}
	return live, true
}

// belongsToLineageLocked reports whether h belongs to a process of lin.
func (e *Engine) belongsToLineageLocked(h *hold, lin Lineage) bool {
	procs, _ := e.procsLocked(h)
	for _, p := range procs {
		if lin.Contains(p) {
			return true
		}
	}
	return false
}

// exemptLocked reports whether the request rc may ignore hold h at step s
// because of lineage.
func (e *Engine) exemptLocked(h *hold, s step, rc *reqCtx) bool {
	if len(rc.lineage) == 0 {
		return false
	}
	procs, inherited := e.procsLocked(h)
	for _, p := range procs {
		if p == rc.lineage.Self() {
			// Same process: only its own two explicit holds of one
			// control file conflict, as two open file descriptions do
			// in the kernel. A hold it holds as an heir is its own.
			if inherited || !s.explicit || h.explicit == 0 {
				return true
			}
			continue
		}
		if rc.lineage[1:].Contains(p) {
			return true
		}
	}
	return false
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
		if h.lost == nil && e.belongsToLineageLocked(h, rc.lineage) {
			return true
		}
	}
	return false
}

// blockedByHoldsLocked reports whether a live hold of ls conflicts with
// step s of rc (exemptions aside).
func (e *Engine) blockedByHoldsLocked(ls *lockState, s step, rc *reqCtx) bool {
	if s.mode != Exclusive && ls.nExclusive == 0 {
		return false
	}
	for _, h := range ls.holds {
		if h.owner != rc.req.Owner && Conflicts(h.mode(), s.mode) && !e.exemptLocked(h, s, rc) {
			return true
		}
	}
	return false
}

// grantableLocked reports whether step s of rc (queued as w, or not yet
// queued if w is nil) can be granted now as far as this host's processes
// are concerned: no live hold conflicts with it (exemptions aside), and
// FIFO lets it go, or its lineage already holds the lock.
func (e *Engine) grantableLocked(ls *lockState, s step, rc *reqCtx, w *waiter) bool {
	if e.blockedByHoldsLocked(ls, s, rc) {
		return false
	}
	return ls.fifoOKLocked(s, w) || e.privilegedLocked(ls, rc)
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
		if h.lost == nil && e.belongsToLineageLocked(h, rc.lineage) {
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
			if h.owner == rc.req.Owner || e.belongsToLineageLocked(h, rc.lineage) {
				return nil
			}
		}
	}
	return fmt.Errorf("a usage lock is held by this process or an ancestor: %w", ErrDeadlock)
}
