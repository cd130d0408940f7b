package lockmgr

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// Who a hold belongs to after the process that took it exits (SPEC §2.3).
//
// The engine watches the process behind every hold (ProcessWatcher.
// WaitExit: a pidfd, no polling), one watch per process however many holds
// it has. When the process that took a flock hold (OwnerFile) exits while
// the hold remains (the descriptor lives on, e.g. in the command flock(1)
// ran, or in the shell that opened it with exec 8>), the engine asks who
// holds a descriptor of the control file (ProcessWatcher.Descriptors,
// grouped by open file description) and picks the hold's group:
//
//   - a group is ruled out if it holds a process that is known to hold
//     (or wait for) the same lock through another open file description,
//     and that holds no other group: that group is the other description;
//   - if exactly one group remains (groups held by the same processes
//     count as one: whichever is the hold's, those processes hold it),
//     its processes are the hold's heirs:
//     the hold belongs to them, and they and their descendants run under
//     it. If none or several remain, nobody is named: the hold belongs to
//     nobody, so it still excludes every other process until its last
//     descriptor is closed and the kernel releases it. Several may remain
//     for a moment only (a process reading the control file's status, a
//     waiter that has opened it and not yet asked): the engine scans
//     again, five times over about 7 s (heirRescans), before it leaves
//     the hold to nobody for good.
//
// The lock never passes to the dead process's parent merely for being its
// parent. When every heir has exited, the engine looks once more (a heir's
// child may hold the descriptor now). POSIX record locks (OwnerPOSIX) die
// with their process, so their holds get no heirs.
//
// The scan reads /proc and runs without Engine.mu; a change of who a hold
// belongs to wakes every waiter of its lock, which look again.
//
// A watch outlives its last hold by watchLinger: a process that locks and
// unlocks in a loop (or waits its turn among others) would otherwise open
// a pidfd, register it with the poller, start a goroutine and tear all of
// it down again at every lock, several syscalls per request. An idle
// watch holds no hold and changes no answer (a process without holds is
// alive to the engine whether it is watched or not). It ends when its
// process exits, when it is reused, or at the first track or untrack after
// watchLinger (idleLocked, sweepIdleLocked): no timer, so a quiet engine
// keeps its idle watches until its next lock request or until their
// processes exit, at most one pidfd per such process.

// watchLinger is how long a watch without holds is kept for reuse.
const watchLinger = 5 * time.Second

// noticeExitsDropsMu is for a request about to be refused without waiting
// (LOCK_NB): an exit watch reports asynchronously, and the holds that block
// the request may belong to a process that has just exited, whose heir
// the request descends from. It looks at the processes behind those holds
// in /proc, without mu, and hands on the holds of those that have exited.
// It reports whether any had: then the request looks again.
func (e *Engine) noticeExitsDropsMu(ctx context.Context, ls *lockState, s step, rc *reqCtx) bool {
	if e.watcher == nil {
		return false
	}
	var takers []ProcID
	scanning := false
	for _, h := range ls.holds.all() {
		if len(h.lineage) == 0 || !e.blocksLocked(h, waitNode{ls, s, rc, nil}) {
			continue
		}
		scanning = scanning || h.fateOf().scanning > 0
		if w := e.watches[h.lineage[0]]; w != nil && !w.exited {
			takers = append(takers, h.lineage[0])
		}
	}
	if scanning {
		// An exit is being handled: wait for its heirs.
		return e.waitChangeDropsMu(ctx, ls, 0) == nil
	}
	if len(takers) == 0 {
		return false
	}
	e.mu.Unlock()
	var dead []ProcID
	for _, p := range takers {
		if !e.procs.Alive(p) {
			dead = append(dead, p)
		}
	}
	e.mu.Lock()
	for _, p := range dead {
		if w := e.watches[p]; w != nil && !w.exited {
			e.exitedNowDropsMu(w)
		}
	}
	return len(dead) > 0
}

// reassignDropsMu finds heirs for the holds of w's process, which has
// exited, and wakes the waiters of their locks. mu is dropped for the
// /proc scans.
func (e *Engine) reassignDropsMu(w *procWatch) {
	var holds []*hold
	touched := map[LockID]bool{}
	for h := range w.holds {
		touched[h.lockID()] = true
		procs, _ := e.procsLocked(h)
		if len(procs) == 0 && !h.fateOf().scanned && h.owner.Class == OwnerFile && h.ino != 0 && h.lostErr() == nil {
			holds = append(holds, h)
		}
	}
	e.findHeirsDropsMu(holds)
	for id := range touched {
		if ls := e.locks[id]; ls != nil {
			ls.wakeAllLocked()
		}
	}
}

// findHeirsDropsMu scans /proc for the holders of the descriptors of the
// holds' control files, with mu dropped, and names each hold's heirs. A
// hold whose scan found several candidate descriptions is scanned again
// later (rescanLaterLocked).
func (e *Engine) findHeirsDropsMu(holds []*hold) {
	if len(holds) == 0 {
		return
	}
	// One /proc scan for every control file of the holds: the holds of
	// one process that held many locks (and the shared holds on their
	// ancestors, which carry the same control files) are handed on
	// together when it exits.
	known := map[uint64]map[int]bool{}
	var inos []uint64
	idx := othersIndex{}
	for _, h := range holds {
		h.setFate().scanning++
		if known[h.ino] == nil {
			known[h.ino] = map[int]bool{}
			inos = append(inos, h.ino)
		}
		for p := range e.othersLocked(h, idx) {
			known[h.ino][p.PID] = true
		}
	}
	e.mu.Unlock()
	// The scan ends when the engine closes: Close does not wait for it.
	found, err := scanDescriptors(e.ctx, e.watcher, inos, func(ino uint64, pid int) bool { return known[ino][pid] })
	if err != nil && e.ctx.Err() == nil {
		e.log.WithError(err).Warn("cannot tell who holds a lock's descriptor: nobody inherits it")
	}
	e.mu.Lock()
	idx = othersIndex{}
	for _, h := range holds {
		h.rare.fate.scanning-- // set above
		if ls := e.locks[h.lockID()]; ls == nil || ls.holds.get(h.owner) != h {
			continue // released meanwhile
		}
		if procs, _ := e.procsLocked(h); len(procs) > 0 || h.rare.fate.scanned {
			continue
		}
		heirs, candidates := e.pickHeirsLocked(h, found[h.ino], idx)
		e.setHeirsLocked(h, heirs)
		if candidates > 1 {
			e.rescanLaterLocked(h)
		}
	}
}

// scanDescriptors is how findHeirsDropsMu asks the watcher: one call for
// every inode. A variable only so that a test's control can scan once per
// control file, as before.
var scanDescriptors = func(ctx context.Context, w ProcessWatcher, inos []uint64, known func(ino uint64, pid int) bool) (map[uint64][][]ProcID, error) {
	return w.Descriptors(ctx, inos, known)
}

// heirRescans are the delays of the scans that follow one that found
// several candidate descriptions for a hold: a process that has the
// control file open for a moment (cat .lock, a waiter between its open and
// its lock request) is a candidate of its own, and would otherwise leave
// the hold to nobody for good. About 7 s in all, then the hold stays
// nobody's until it is released. A variable only so that a test's control
// can leave the rescans out; nothing else changes it.
var heirRescans = []time.Duration{
	20 * time.Millisecond, 80 * time.Millisecond, 320 * time.Millisecond,
	1280 * time.Millisecond, 5120 * time.Millisecond,
}

// rescanLaterLocked scans again for h's heirs after the next delay of
// heirRescans, if h is still held and nobody's by then; it wakes the
// waiters of h's lock if the scan names heirs.
func (e *Engine) rescanLaterLocked(h *hold) {
	r := h.setFate()
	if int(r.rescans) >= len(heirRescans) {
		return
	}
	timer := e.after(heirRescans[r.rescans])
	r.rescans++
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		select {
		case <-e.ctx.Done():
			return
		case <-timer:
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		ls := e.locks[h.lockID()]
		if f := h.fateOf(); ls == nil || ls.holds.get(h.owner) != h || f.lost != nil || !f.scanned || len(f.heirs) > 0 {
			return // released, lost, taken again or named meanwhile
		}
		h.rare.fate.scanned = false // fateOf said true
		e.findHeirsDropsMu([]*hold{h})
		if len(h.fateOf().heirs) > 0 {
			ls.wakeAllLocked()
		}
	}()
}

// setHeirsLocked records heirs for h and watches them.
func (e *Engine) setHeirsLocked(h *hold, heirs []ProcID) {
	r := h.setFate()
	for _, p := range r.heirs {
		e.untrackLocked(h, p)
	}
	r.heirs, r.scanned = heirs, true
	for _, p := range heirs {
		e.trackLocked(h, p)
	}
	if len(heirs) > 0 {
		// A heir that exits later hands on to whoever holds the
		// descriptor then.
		r.scanned = false
		for _, p := range heirs {
			if !e.exitedLocked(p) {
				return
			}
		}
		r.scanned = true
	}
}

// othersLocked returns the processes known to hold or wait for h's lock
// through another open file description of h's control file (h.ino): the
// one descriptor of that file such a process has is that other
// description. A process that holds h's lock through a descriptor of
// another control file (an ancestor's hold taken for a lock below) says
// nothing about its descriptors of h's: a child of a shell that holds
// a/.lock through exec 8> inherits descriptor 8 and locks a/b/.lock, which
// holds a shared; counting it made descriptor 8 two groups, so the shell's
// hold on a found no heir and refused the child. idx holds what was
// gathered of each lock since mu was last taken.
func (e *Engine) othersLocked(h *hold, idx othersIndex) map[ProcID]bool {
	others := map[ProcID]bool{}
	ls := e.locks[h.lockID()]
	if ls == nil {
		return others
	}
	for _, pt := range idx.of(e, ls)[h.ino] {
		if pt.owner != h.owner {
			others[pt.p] = true
		}
	}
	return others
}

// othersIndex is, per lock, the parties that othersLocked counts, by the
// inode of their control file: gathered once per lock and scan, since a
// lock that many locks below it hold shared (their ancestor) has a hold
// per owner, and going through all of them for each hold made the exit of
// a process holding N locks cost N² steps. Valid while mu stays held.
type othersIndex map[*lockState]map[uint64][]party

// party is a holder or waiter of a lock through a control file: its owner
// and the process that took it.
type party struct {
	owner Owner
	p     ProcID
}

// of returns ls's parties by inode, gathering them on first use: the
// holds of live takers and the waiters, through flock (OwnerFile).
func (idx othersIndex) of(e *Engine, ls *lockState) map[uint64][]party {
	if m, ok := idx[ls]; ok {
		return m
	}
	m := map[uint64][]party{}
	for _, o := range ls.holds.all() {
		if o.owner.Class == OwnerFile && len(o.lineage) > 0 && !e.exitedLocked(o.lineage[0]) {
			m[o.ino] = append(m[o.ino], party{o.owner, o.lineage[0]})
		}
	}
	for q := ls.head; q != nil; q = q.next {
		if q.rc.req.Owner.Class == OwnerFile && len(q.rc.lineage) > 0 {
			m[q.rc.req.Ino] = append(m[q.rc.req.Ino], party{q.rc.req.Owner, q.rc.lineage[0]})
		}
	}
	idx[ls] = m
	return m
}

// pickHeirsLocked chooses h's open file description among the groups of
// descriptors of its control file (see the rules at the top of the file).
// candidates is the number of groups that were not ruled out, groups held
// by the same processes counted once: heirs are named only if it is 1.
func (e *Engine) pickHeirsLocked(h *hold, groups [][]ProcID, idx othersIndex) (heirs []ProcID, candidates int) {
	ls := e.locks[h.lockID()]
	if ls == nil || len(groups) == 0 {
		return nil, 0
	}
	others := e.othersLocked(h, idx)
	inGroups := map[ProcID]int{}
	for _, g := range groups {
		for _, p := range g {
			inGroups[p]++
		}
	}
	var pick []ProcID
	n := 0
	for _, g := range groups {
		ruledOut := false
		for _, p := range g {
			if others[p] && inGroups[p] == 1 {
				ruledOut = true
				break
			}
		}
		switch {
		case ruledOut:
		case n == 0:
			pick, n = slices.Clone(g), 1
			slices.SortFunc(pick, compareProcs)
		case !sameProcs(pick, g):
			n++
		}
	}
	if n != 1 {
		return nil, n
	}
	return pick, n
}

// sameProcs reports whether g holds exactly the processes of sorted, a
// sorted list: then the two descriptions have the same holders, and it
// does not matter which of them is the hold's (a process that opened the
// control file many times and outlived its parent, who took the lock
// through one of them).
func sameProcs(sorted, g []ProcID) bool {
	if len(g) != len(sorted) {
		return false
	}
	g = slices.Clone(g)
	slices.SortFunc(g, compareProcs)
	return slices.Equal(sorted, g)
}

// compareProcs orders processes by pid, then start time.
func compareProcs(a, b ProcID) int {
	if c := cmp.Compare(a.PID, b.PID); c != 0 {
		return c
	}
	return cmp.Compare(a.Start, b.Start)
}
