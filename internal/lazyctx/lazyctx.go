// Package lazyctx is a cancellable context that is made only when first
// used. A context.WithCancel registers itself with its parent and
// allocates; a lock request that is granted at once (most of them) never
// waits on its context, so both the FUSE request's cancellable context (fs)
// and a backend claim's context merged with the engine's (lockmgr) put the
// derivation off until Done or Err is called. Each cost about 6-7 % of the
// daemon's CPU in a flock pair before (bench's TestProfileDaemon).
package lazyctx

import (
	"context"
	"sync"
	"time"
)

// Ctx is a child of its parent, also cancelled by Cancel and, if stop is
// not nil, when stop is done. The child is made on the first call of Done
// or Err; a Cancel before that is kept and applied when it is made.
type Ctx struct {
	parent context.Context
	stop   context.Context // nil: none

	mu       sync.Mutex
	ctx      context.Context    // GUARDED_BY(mu); nil until first use
	cancelFn context.CancelFunc // GUARDED_BY(mu)
	unreg    func() bool        // GUARDED_BY(mu); the AfterFunc on stop, if made
	canceled bool               // GUARDED_BY(mu)
}

// New returns parent's lazily made child, also cancelled when stop (nil:
// none) is done.
func New(parent, stop context.Context) *Ctx {
	return &Ctx{parent: parent, stop: stop}
}

// get returns the child, making it on first use.
func (c *Ctx) get() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		c.ctx, c.cancelFn = context.WithCancel(c.parent)
		if c.canceled {
			c.cancelFn()
		} else if c.stop != nil {
			c.unreg = context.AfterFunc(c.stop, c.cancelFn)
		}
	}
	return c.ctx
}

// Cancel cancels the context, now if it is made, else when it is, and
// undoes the watch of stop.
func (c *Ctx) Cancel() {
	c.mu.Lock()
	c.canceled = true
	fn, unreg := c.cancelFn, c.unreg
	c.mu.Unlock()
	if unreg != nil {
		unreg()
	}
	if fn != nil {
		fn()
	}
}

// Made reports whether the child has been made (tests).
func (c *Ctx) Made() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctx != nil
}

// Deadline is the parent's.
func (c *Ctx) Deadline() (time.Time, bool) { return c.parent.Deadline() }

// Done makes the child and returns its Done.
func (c *Ctx) Done() <-chan struct{} { return c.get().Done() }

// Err makes the child and returns its Err.
func (c *Ctx) Err() error { return c.get().Err() }

// Value answers from the parent until the child is made: the values are
// the parent's either way, and fs's metrics read one after every request.
// The standard library asks for its own key (to find a parent it can
// register with) only after Done, which makes the child first.
func (c *Ctx) Value(key any) any {
	c.mu.Lock()
	made := c.ctx
	c.mu.Unlock()
	if made != nil {
		return made.Value(key)
	}
	return c.parent.Value(key)
}
