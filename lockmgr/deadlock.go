package lockmgr

// Deadlock detection (SPEC §2.5). The wait-for graph's nodes are threads: a
// thread blocked in a lock wait waits for one step of one request. Its
// edges go to the threads that took the conflicting holds and to the
// earlier waiters it queues behind. A request whose wait would close a
// cycle through its own thread fails at once with ErrDeadlock. A thread
// that took a hold and is not waiting ends every path: it can still release.
//
// Holds that other hosts or processes outside lockfs have on the backend
// are invisible here; across hosts, timeouts are the answer.

// closesCycleLocked reports whether thread tid, waiting for the given
// blocker threads, would close a cycle.
func (e *Engine) closesCycleLocked(tid int, blockers []int) bool {
	seen := make(map[int]bool)
	stack := append([]int(nil), blockers...)
	for len(stack) > 0 {
		b := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if b == tid {
			return true
		}
		if seen[b] {
			continue
		}
		seen[b] = true
		w := e.waiting[b]
		if w == nil {
			continue
		}
		ls := e.locks[w.step.id]
		if ls == nil {
			continue
		}
		next, _ := e.grantableLocked(ls, w.step, w.rc, w)
		stack = append(stack, next...)
	}
	return false
}
