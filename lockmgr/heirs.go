package lockmgr

import (
	"context"
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
//   - if exactly one group remains, its processes are the hold's heirs:
//     the hold belongs to them, and they and their descendants run under
//     it. If none or several remain, nobody is named: the hold belongs to
//     nobody, so it still excludes every other process until its last
//     descriptor is closed and the kernel releases it.
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

// procWatch is the engine's watch on one process.
type procWatch struct {
	// holds are the holds whose taker or heir the process is.
	holds map[*hold]struct{}
	// exited: the process has exited.
	exited bool
	// cancel stops the watch's goroutine.
	cancel context.CancelFunc
	// idleSince is when the watch lost its last hold (zero while it has
	// holds): it is ended after watchLinger unless reused.
	idleSince time.Time
	// queued: the watch has an entry in Engine.idle.
	queued bool
}

// idleWatch is an entry of Engine.idle: watch w of process p, queued at
// since. A watch has at most one entry (procWatch.queued).
type idleWatch struct {
	p     ProcID
	w     *procWatch
	since time.Time
}

// exitedLocked reports whether the engine has seen p exit. A process it
// does not watch counts as alive.
func (e *Engine) exitedLocked(p ProcID) bool {
	w := e.watches[p]
	return w != nil && w.exited
}

// trackLocked records that hold h depends on process p, and watches p.
func (e *Engine) trackLocked(h *hold, p ProcID) {
	if p == (ProcID{}) || e.watcher == nil {
		return
	}
	e.sweepIdleLocked()
	w := e.watches[p]
	if w == nil {
		ctx, cancel := context.WithCancel(e.ctx)
		w = &procWatch{holds: make(map[*hold]struct{}, 1), cancel: cancel}
		e.watches[p] = w
		e.wg.Add(1)
		go e.watchExit(ctx, w, p)
	}
	w.holds[h] = struct{}{}
	w.idleSince = time.Time{}
}

// untrackLocked undoes trackLocked.
func (e *Engine) untrackLocked(h *hold, p ProcID) {
	w := e.watches[p]
	if w == nil {
		return
	}
	delete(w.holds, h)
	if len(w.holds) == 0 {
		e.idleLocked(p, w)
	}
	e.sweepIdleLocked()
}

// idleLocked keeps w, p's watch that has just lost its last hold, for
// reuse (watchLinger), or ends it if p has exited.
func (e *Engine) idleLocked(p ProcID, w *procWatch) {
	if w.exited || e.linger <= 0 {
		e.endWatchLocked(p, w)
		return
	}
	w.idleSince = e.now()
	if !w.queued {
		w.queued = true
		e.idle = append(e.idle, idleWatch{p: p, w: w, since: w.idleSince})
	}
}

// sweepIdleLocked ends the watches idle for watchLinger. e.idle is in the
// order the entries were queued; an entry found reused is dropped, one
// found idle again since it was queued is queued again from then.
func (e *Engine) sweepIdleLocked() {
	now := e.now()
	for len(e.idle) > 0 && now.Sub(e.idle[0].since) >= e.linger {
		iw := e.idle[0]
		e.idle[0] = idleWatch{}
		e.idle = e.idle[1:]
		w := iw.w
		switch {
		case e.watches[iw.p] != w || len(w.holds) > 0:
			w.queued = false // ended, or in use again
		case now.Sub(w.idleSince) >= e.linger:
			w.queued = false
			e.endWatchLocked(iw.p, w)
		default:
			e.idle = append(e.idle, idleWatch{p: iw.p, w: w, since: w.idleSince})
		}
	}
}

// endWatchLocked stops p's watch w and forgets it.
func (e *Engine) endWatchLocked(p ProcID, w *procWatch) {
	w.cancel()
	if e.watches[p] == w {
		delete(e.watches, p)
	}
}

// untrackAllLocked drops every watch of hold h: its taker's and its heirs'.
func (e *Engine) untrackAllLocked(h *hold) {
	if len(h.lineage) > 0 {
		e.untrackLocked(h, h.lineage[0])
	}
	for _, p := range h.heirs {
		e.untrackLocked(h, p)
	}
	h.heirs, h.scanned = nil, false
}

// setTakerLocked makes rc's process the taker of h.
func (e *Engine) setTakerLocked(h *hold, lin Lineage) {
	e.untrackAllLocked(h)
	h.lineage = lin
	if len(lin) > 0 {
		e.trackLocked(h, lin[0])
	}
}

// watchExit waits for p to exit, then hands the holds that depended on it
// to their heirs.
func (e *Engine) watchExit(ctx context.Context, w *procWatch, p ProcID) {
	defer e.wg.Done()
	if err := e.watcher.WaitExit(ctx, p); err != nil {
		return // stopped
	}
	e.mu.Lock()
	if e.watches[p] == w && !w.exited {
		e.exitedNowLocked(w)
		if len(w.holds) == 0 {
			e.endWatchLocked(p, w) // idle: nothing more to watch
		}
	}
	e.mu.Unlock()
}

// exitedNowLocked records that w's process has exited and hands its holds on.
func (e *Engine) exitedNowLocked(w *procWatch) {
	w.exited = true
	e.exitWork++
	e.reassignLocked(w)
	e.exitWork--
}

// noticeExitsLocked is for a request about to be refused without waiting
// (LOCK_NB): an exit watch reports asynchronously, and the holds that block
// the request may belong to a process that has just exited, whose heir
// the request descends from. It looks at the processes behind those holds
// in /proc, without mu, and hands on the holds of those that have exited.
// It reports whether any had: then the request looks again.
func (e *Engine) noticeExitsLocked(ctx context.Context, ls *lockState, s step, rc *reqCtx) bool {
	if e.watcher == nil {
		return false
	}
	var takers []ProcID
	scanning := false
	for _, h := range ls.holds {
		if len(h.lineage) == 0 || !e.blocksLocked(h, waitNode{ls, s, rc, nil}) {
			continue
		}
		scanning = scanning || h.scanning > 0
		if w := e.watches[h.lineage[0]]; w != nil && !w.exited {
			takers = append(takers, h.lineage[0])
		}
	}
	if scanning {
		// An exit is being handled: wait for its heirs.
		return e.waitChangeLocked(ctx, ls, 0) == nil
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
			e.exitedNowLocked(w)
		}
	}
	return len(dead) > 0
}

// reassignLocked finds heirs for the holds of w's process, which has
// exited, and wakes the waiters of their locks. mu is dropped for the
// /proc scans.
func (e *Engine) reassignLocked(w *procWatch) {
	type job struct {
		h   *hold
		ino uint64
	}
	var jobs []job
	touched := map[LockID]bool{}
	for h := range w.holds {
		touched[h.id] = true
		procs, _ := e.procsLocked(h)
		if len(procs) == 0 && !h.scanned && h.owner.Class == OwnerFile && h.ino != 0 && h.lost == nil {
			jobs = append(jobs, job{h, h.ino})
		}
	}
	if len(jobs) > 0 {
		known := map[uint64]map[int]bool{}
		for _, j := range jobs {
			j.h.scanning++
			if known[j.ino] == nil {
				known[j.ino] = map[int]bool{}
			}
			for p := range e.othersLocked(j.h) {
				known[j.ino][p.PID] = true
			}
		}
		found := make(map[uint64][][]ProcID)
		e.mu.Unlock()
		for _, j := range jobs {
			if _, ok := found[j.ino]; ok {
				continue
			}
			k := known[j.ino]
			groups, err := e.watcher.Descriptors(j.ino, func(pid int) bool { return k[pid] })
			if err != nil {
				e.log.WithError(err).Warn("cannot tell who holds a lock's descriptor: nobody inherits it")
			}
			found[j.ino] = groups
		}
		e.mu.Lock()
		for _, j := range jobs {
			j.h.scanning--
			if ls := e.locks[j.h.id]; ls == nil || ls.holds[j.h.owner] != j.h {
				continue // released meanwhile
			}
			if procs, _ := e.procsLocked(j.h); len(procs) > 0 || j.h.scanned {
				continue
			}
			e.setHeirsLocked(j.h, e.pickHeirsLocked(j.h, found[j.ino]))
		}
	}
	for id := range touched {
		if ls := e.locks[id]; ls != nil {
			ls.wakeAllLocked()
		}
	}
}

// setHeirsLocked records heirs for h and watches them.
func (e *Engine) setHeirsLocked(h *hold, heirs []ProcID) {
	for _, p := range h.heirs {
		e.untrackLocked(h, p)
	}
	h.heirs, h.scanned = heirs, true
	for _, p := range heirs {
		e.trackLocked(h, p)
	}
	if len(heirs) > 0 {
		// A heir that exits later hands on to whoever holds the
		// descriptor then.
		h.scanned = false
		for _, p := range heirs {
			if !e.exitedLocked(p) {
				return
			}
		}
		h.scanned = true
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
// hold on a found no heir and refused the child.
func (e *Engine) othersLocked(h *hold) map[ProcID]bool {
	others := map[ProcID]bool{}
	ls := e.locks[h.id]
	if ls == nil {
		return others
	}
	for _, o := range ls.holds {
		if o != h && o.ino == h.ino && o.owner.Class == OwnerFile && len(o.lineage) > 0 && !e.exitedLocked(o.lineage[0]) {
			others[o.lineage[0]] = true
		}
	}
	for q := ls.head; q != nil; q = q.next {
		if q.rc.req.Owner != h.owner && q.rc.req.Ino == h.ino && q.rc.req.Owner.Class == OwnerFile && len(q.rc.lineage) > 0 {
			others[q.rc.lineage[0]] = true
		}
	}
	return others
}

// pickHeirsLocked chooses h's open file description among the groups of
// descriptors of its control file (see the rules at the top of the file).
func (e *Engine) pickHeirsLocked(h *hold, groups [][]ProcID) []ProcID {
	ls := e.locks[h.id]
	if ls == nil || len(groups) == 0 {
		return nil
	}
	others := e.othersLocked(h)
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
		if !ruledOut {
			pick = g
			n++
		}
	}
	if n != 1 {
		return nil
	}
	return pick
}
