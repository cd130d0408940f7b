package lockmgr

// This file holds the lineage rule (SPEC §2.3); the usage rule (§2.4),
// which a request meets before its first step, is acquire.go's
// usageRuleLocked.
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
	heirs := h.fateOf().heirs
	live := heirs[:0:0]
	for _, p := range heirs {
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
	if h := ls.holds.get(rc.req.Owner); h != nil && h.lostErr() == nil {
		return true
	}
	if len(rc.lineage) == 0 {
		return false
	}
	for _, h := range ls.holds.all() {
		if h.lostErr() == nil && e.belongsToLineageLocked(h, rc.lineage) {
			return true
		}
	}
	return false
}
