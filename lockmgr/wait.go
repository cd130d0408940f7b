package lockmgr

import (
	"context"
	"time"
)

// selfWait is the grace of a thread that waits for its own hold.
type selfWait struct {
	timer <-chan time.Time // running while the thread waits for itself
	over  bool             // the timer has fired
}

// refuseCycleLocked returns ErrDeadlock if the wait of step s would close
// a cycle of waits. A thread that waits for its own hold may be looking at
// a descriptor it has just closed: the kernel reports the last close of a
// flock'd file asynchronously. Such a wait gets selfDeadlockGrace (on the
// injected clock) for that release to arrive before it is refused.
func (e *Engine) refuseCycleLocked(ls *lockState, s step, rc *reqCtx, w *waiter, sw *selfWait) error {
	cycle, self := e.closesCycleLocked(ls, s, rc, w)
	switch {
	case !cycle:
		*sw = selfWait{}
		return nil
	case !self || sw.over:
		return ErrDeadlock
	case sw.timer == nil:
		sw.timer = e.after(selfDeadlockGrace)
	}
	return nil
}

// leaveQueueDropsMu takes w out of the queue of lock id after its request
// failed or was cancelled, and settles the lock.
func (e *Engine) leaveQueueDropsMu(id LockID, w *waiter) {
	ls := e.locks[id]
	if ls == nil {
		if e.waiting[w.rc.req.TID] == w {
			delete(e.waiting, w.rc.req.TID)
		}
		return
	}
	e.dequeueLocked(ls, w)
	e.settleDropsMu(ls)
}

// selfDeadlockGrace is how long a thread that waits for its own hold
// waits for that hold's release to arrive before the wait is refused as a
// deadlock: the release of a closed flock descriptor arrives after close().
const selfDeadlockGrace = 250 * time.Millisecond

// parking is what a sleeping request waits on: its queue entry's wake
// channel or a lock's changed channel, and the self-wait grace's timer.
type parking struct {
	ch    chan struct{}
	timer <-chan time.Time
}

// sleepDropsMu drops mu until w is woken, the self-wait grace runs out or
// ctx ends.
func (e *Engine) sleepDropsMu(ctx context.Context, w *waiter, sw *selfWait) error {
	tid := w.rc.req.TID
	var timer <-chan time.Time
	if !sw.over {
		timer = sw.timer
	}
	e.parked[tid] = parking{ch: w.wake, timer: timer}
	e.mu.Unlock()
	var err error
	select {
	case <-w.wake:
	case <-timer:
		sw.over = true
	case <-ctx.Done():
		err = ctx.Err()
	}
	e.mu.Lock()
	w.signalled = false
	delete(e.parked, tid)
	return err
}

// waitChangeDropsMu drops mu until ls changes or ctx ends. tid, if not 0,
// is recorded as parked meanwhile.
func (e *Engine) waitChangeDropsMu(ctx context.Context, ls *lockState, tid int) error {
	ch := ls.changedLocked()
	if tid != 0 {
		e.parked[tid] = parking{ch: ch}
		defer delete(e.parked, tid)
	}
	e.mu.Unlock()
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	}
	e.mu.Lock()
	return err
}
