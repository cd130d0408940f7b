package lockmgr

// Deadlock detection (SPEC §2.5). The wait-for graph's nodes are threads: a
// thread blocked in a lock wait waits for one step of one request. Its
// edges go to the threads behind the conflicting holds and, through FIFO,
// to the earlier waiters it queues behind, which in turn wait for the
// holds that conflict with them. A request whose wait would close a cycle
// through its own thread fails at once with ErrDeadlock. A thread that
// took a hold and is not waiting ends every path: it can still release.
//
// The thread behind a hold is the thread that took it while its process
// lives. Once that process has exited, the hold belongs to its heirs
// (heirs.go): processes that hold a descriptor, not lock requests. A heir
// (the shell of `exec 8>a/.lock; flock 8`) is taken to wait for whatever
// its descendants wait for: they run under its locks, and it waits for
// them, so `flock 9` of one such shell against `flock 8` of another is a
// cycle like any other.
//
// The cost of a check does not grow with the length of the queues it
// crosses: a lock's queue is looked at only if one of its holders could
// lead back to the requester (it waits itself, or is the requester).
//
// Holds that other hosts or processes outside lockfs have on the backend
// are invisible here; across hosts, timeouts are the answer.

// waitNode is one wait in the graph: step s of rc on ls, queued as w (nil
// for a request not queued yet, which counts as the tail).
type waitNode struct {
	ls *lockState
	s  step
	rc *reqCtx
	w  *waiter
}

// closesCycleLocked reports whether the wait of step s of rc on ls closes
// a cycle of waits, and self whether the requesting thread waits directly
// for a hold of its own (see selfDeadlockGrace).
func (e *Engine) closesCycleLocked(ls *lockState, s step, rc *reqCtx, w *waiter) (cycle, self bool) {
	tid := rc.req.TID
	start := waitNode{ls, s, rc, w}
	for _, h := range ls.holds.all() {
		if e.blocksLocked(h, start) {
			for _, t := range e.holdThreadsLocked(h) {
				if t == tid {
					return true, true
				}
			}
		}
	}
	seen := map[int]bool{tid: true}
	stack := []waitNode{start}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, t := range e.waitsForLocked(n, tid) {
			if t == tid || e.heirAboveLocked(t, rc) {
				return true, false
			}
			if seen[t] {
				continue
			}
			seen[t] = true
			stack = append(stack, e.waitsOfLocked(t)...)
		}
	}
	return false, false
}

// blocksLocked reports whether hold h makes wait n wait. A wait that the
// yield of n's lease holds back (lease.go) waits for every live hold, as
// an exclusive one would.
func (e *Engine) blocksLocked(h *hold, n waitNode) bool {
	mode := n.s.mode
	if e.yieldBlocksLocked(n.ls, n.s, n.rc) {
		mode = Exclusive
	}
	return h.owner != n.rc.req.Owner && Conflicts(h.mode(), mode) && !e.exemptLocked(h, n.s, n.rc)
}

// holdThreadsLocked names the threads behind hold h: the thread that took
// it, or once its process has exited, the main threads of its heirs.
func (e *Engine) holdThreadsLocked(h *hold) []int {
	procs, inherited := e.procsLocked(h)
	if !inherited {
		return []int{int(h.tid)}
	}
	out := make([]int, len(procs))
	for i, p := range procs {
		out[i] = p.PID
	}
	return out
}

// leadsBackLocked reports whether a path through thread t may return to
// tid: t is tid, waits itself, or is the main thread of a heir (whose
// descendants' waits count as its own).
func (e *Engine) leadsBackLocked(t, tid int, inherited bool) bool {
	return t == tid || e.waiting[t] != nil || inherited
}

// waitsForLocked returns the threads wait n waits for that may lead back
// to tid: behind the holds that block n or, through FIFO, the earlier
// waiters n queues behind.
func (e *Engine) waitsForLocked(n waitNode, tid int) []int {
	var candidates []*hold
	for _, h := range n.ls.holds.all() {
		if h.mode() == 0 {
			continue
		}
		_, inherited := e.procsLocked(h)
		for _, t := range e.holdThreadsLocked(h) {
			if e.leadsBackLocked(t, tid, inherited) {
				candidates = append(candidates, h)
				break
			}
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	// The waits that n stands for: itself, and the earlier waiters it
	// queues behind, directly or through those it queues behind.
	waits := []waitNode{n}
	if !e.privilegedLocked(n.ls, n.rc) {
		needAll, needX := n.s.mode == Exclusive, n.s.mode == Shared
		q := n.ls.tail
		if n.w != nil {
			q = n.w.prev
		}
		for ; q != nil && (needAll || needX); q = q.prev {
			if !needAll && q.step.mode != Exclusive {
				continue
			}
			waits = append(waits, waitNode{n.ls, q.step, q.rc, q})
			if !e.privilegedLocked(n.ls, q.rc) {
				needAll = needAll || q.step.mode == Exclusive
			}
		}
	}
	var out []int
	for _, h := range candidates {
		for _, wn := range waits {
			if e.blocksLocked(h, wn) {
				out = append(out, e.holdThreadsLocked(h)...)
				break
			}
		}
	}
	return out
}

// waitsOfLocked returns the waits that thread t stands for: its own, and,
// if t is the main thread of a heir process, those of the threads that
// descend from it.
func (e *Engine) waitsOfLocked(t int) []waitNode {
	var out []waitNode
	if w := e.waiting[t]; w != nil {
		if ls := e.locks[w.step.id]; ls != nil {
			out = append(out, waitNode{ls, w.step, w.rc, w})
		}
	}
	if !e.isHeirLocked(t) {
		return out
	}
	for tid, w := range e.waiting {
		if tid == t || len(w.rc.lineage) < 2 {
			continue
		}
		for _, p := range w.rc.lineage[1:] {
			if p.PID == t {
				if ls := e.locks[w.step.id]; ls != nil {
					out = append(out, waitNode{ls, w.step, w.rc, w})
				}
				break
			}
		}
	}
	return out
}

// heirAboveLocked reports whether t is the main thread of a heir process
// that the requester rc descends from: the heir waits for its descendants,
// the requester among them.
func (e *Engine) heirAboveLocked(t int, rc *reqCtx) bool {
	if len(rc.lineage) < 2 {
		return false
	}
	for _, p := range rc.lineage[1:] {
		if p.PID == t {
			return e.isHeirLocked(t)
		}
	}
	return false
}

// isHeirLocked reports whether pid is a live heir of some hold.
func (e *Engine) isHeirLocked(pid int) bool {
	for p, w := range e.watches {
		if p.PID != pid || w.exited {
			continue
		}
		for h := range w.holds {
			if len(h.lineage) == 0 || h.lineage[0] != p {
				return true
			}
		}
	}
	return false
}
