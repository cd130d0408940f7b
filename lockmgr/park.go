package lockmgr

import (
	"context"
	"time"
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
// Only the wait in a queue parks. The rarer waits stay on the goroutine
// that runs the request, as in Acquire: a backend claim or another
// request's backend call, a conversion of an explicit hold, and a thread's
// wait for its own hold (selfDeadlockGrace).

// AcquireAsync asks for the lock of req as Acquire does and calls answer
// exactly once with what Acquire would have returned. It does not wait for
// the request to sleep in a queue: if the request is answered without
// sleeping there, answer runs on the caller's goroutine before
// AcquireAsync returns; otherwise AcquireAsync returns once the request is
// queued, and answer runs later on a goroutine the engine starts when the
// request is woken (granted, refused, cancelled by ctx, or the engine
// closed). answer is called without the engine's lock held.
func (e *Engine) AcquireAsync(ctx context.Context, req Request, answer func(Grant, error)) {
	if err := req.validate(); err != nil {
		answer(e.invalid(req, err))
		return
	}
	a := &parkedRequest{e: e, ctx: ctx, answer: answer}
	if e.obs != nil {
		a.start = time.Now()
	}
	a.rc = e.newReqCtx(req)
	e.mu.Lock()
	ls, h, err := e.admitLocked(a.rc)
	if err != nil {
		e.mu.Unlock()
		a.finish(Grant{}, err)
		return
	}
	if h != nil {
		a.finish(e.convertUnlocksMu(ctx, ls, h, a.rc))
		return
	}
	a.steps = plan(req.Lock, req.Mode)
	a.runUnlocksMu()
}

// parkedRequest is a request of AcquireAsync between its steps.
type parkedRequest struct {
	// Constant data
	e      *Engine
	ctx    context.Context
	rc     *reqCtx
	steps  []step
	start  time.Time // for the observer
	answer func(Grant, error)

	// Mutable state, GUARDED_BY(e.mu) while the request is parked; owned
	// by the goroutine that runs it otherwise.
	// i is the step being taken.
	i int
	// sw is step i's wait.
	sw stepWait
	// stop ends the watch of ctx while parked (context.AfterFunc).
	stop func() bool
}

// runUnlocksMu takes the steps from a.i on until the request is answered or
// parks. mu is held on entry and dropped on return.
func (a *parkedRequest) runUnlocksMu() {
	e := a.e
	for a.i < len(a.steps) {
		s := a.steps[a.i]
		err := e.tryStepDropsMu(a.ctx, s, a.rc, &a.sw)
		if err == errSleep {
			var parked bool
			if parked, err = a.parkDropsMu(); parked {
				e.mu.Unlock()
				return
			}
			if err == nil {
				continue // woken already: look again
			}
		}
		a.sw.endDropsMu(e, s)
		if err != nil {
			e.rollbackDropsMu(a.steps[:a.i], a.rc.req.Owner)
			e.mu.Unlock()
			a.finish(Grant{}, err)
			return
		}
		a.i++
	}
	e.mu.Unlock()
	a.finish(e.issueToken(a.ctx, a.rc.req))
}

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

// finish reports the outcome and answers. mu is not held.
func (a *parkedRequest) finish(g Grant, err error) {
	a.answer(a.e.answered(a.rc.req, a.start, g, err))
}
