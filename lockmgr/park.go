package lockmgr

import (
	"context"
)

// Waits without a goroutine.
//
// Acquire blocks its caller while the request sleeps in a queue: one
// goroutine per waiting request, whose stack (8 KiB under a FUSE server's
// frames) is most of what 10,000 queued flock(2) calls cost
// (docs/BENCHMARKS.md, the drain). AcquireAsync takes the same steps in
// the same order, but a step that must sleep in a queue parks instead:
// its state (the plan, the step reached, the queue entry) stays in a
// parkedRequest, the waiter points to it, and the caller's goroutine
// returns. Whatever would have woken the sleeping goroutine resumes the
// request on a goroutine started then (waiter.signal), which takes the
// step again exactly as the woken goroutine would have and answers, or
// parks again. The context's end resumes it too, through
// context.AfterFunc, which starts no goroutine until the context ends.
//
// AcquireAsync is acquire.go's, beside Acquire; the request it keeps
// (parkedRequest) and the loop over its steps (runUnlocksMu) are grant.go's,
// beside the step; this file holds the park and the resumption.
//
// Only the wait in a queue parks. The rarer waits stay on the goroutine
// that runs the request, as in Acquire: a backend claim or another
// request's backend call, a conversion of an explicit hold, and a thread's
// wait for its own hold (selfDeadlockGrace).

// parkDropsMu parks the request, queued as a.sw.w, until it is woken; it
// reports whether it did. It does not park if sleepDropsMu would return at
// once (a wake-up is pending, ctx has ended: err), nor during a self-wait
// grace, which it sleeps through on this goroutine.
func (a *parkedRequest) parkDropsMu() (parked bool, err error) {
	e, w := a.e, a.sw.w
	if a.sw.self.timer != nil && !a.sw.self.over {
		return false, e.sleepDropsMu(a.ctx, w, &a.sw.self)
	}
	select {
	case <-w.wake:
		w.signalled = false
		return false, nil
	default:
	}
	if err := a.ctx.Err(); err != nil {
		return false, err
	}
	w.parked = a
	e.parked[a.rc.req.TID] = parking{ch: w.wake}
	// The function runs on a goroutine of its own, started only when ctx
	// ends; registering it takes ctx's lock, never e.mu.
	a.stop = context.AfterFunc(a.ctx, func() {
		e.mu.Lock()
		if w.parked != a {
			e.mu.Unlock() // resumed already
			return
		}
		w.parked = nil
		a.resumeUnlocksMu(a.ctx.Err())
	})
	return true, nil
}

// wakeLocked resumes a parked request that its waiter's wake-up reached
// (waiter.signal), on a new goroutine.
func (a *parkedRequest) wakeLocked() {
	go func() {
		a.e.mu.Lock()
		a.resumeUnlocksMu(nil)
	}()
}

// resumeUnlocksMu goes on with a request woken from its park, as sleepDropsMu
// returns to its step: err is ctx's error if ctx ended. mu is held on
// entry and dropped on return.
func (a *parkedRequest) resumeUnlocksMu(err error) {
	e, w := a.e, a.sw.w
	a.stop()
	if err == nil {
		select {
		case <-w.wake: // sent with the signal that woke it
		default:
		}
	}
	w.signalled = false
	delete(e.parked, a.rc.req.TID)
	if err != nil {
		a.sw.endDropsMu(e, a.steps[a.i])
		e.rollbackDropsMu(a.steps[:a.i], a.rc.req.Owner)
		e.mu.Unlock()
		a.finish(Grant{}, err)
		return
	}
	a.runUnlocksMu()
}
