package lockmgr

import (
	"context"
	"sync"
	"time"
)

// claimCtx is the context of a backend claim that may wait: the request's
// context, also ended when the engine closes. Merging the two takes a child
// context registered with the request's and an AfterFunc on the engine's:
// about 6 % of the daemon's CPU in a blocking flock pair at depth 4, which
// makes five claims (bench's TestProfileDaemon). Most claims never wait, because the flock is free, and never
// look at their context. So the merge is made only on the first call of
// Done, Err or Value.
type claimCtx struct {
	parent context.Context // the request's
	stop   context.Context // the engine's (Engine.ctx)

	mu     sync.Mutex
	merged context.Context // GUARDED_BY(mu)
	cancel context.CancelFunc
	unreg  func() bool
	ended  bool // GUARDED_BY(mu)
}

func newClaimCtx(parent, stop context.Context) *claimCtx {
	return &claimCtx{parent: parent, stop: stop}
}

// get returns the merged context, making it on first use. After end, it is
// cancelled.
func (c *claimCtx) get() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.merged == nil {
		c.merged, c.cancel = context.WithCancel(c.parent)
		if c.ended {
			c.cancel()
		} else {
			c.unreg = context.AfterFunc(c.stop, c.cancel)
		}
	}
	return c.merged
}

func (c *claimCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }
func (c *claimCtx) Done() <-chan struct{}       { return c.get().Done() }
func (c *claimCtx) Err() error                  { return c.get().Err() }
func (c *claimCtx) Value(key any) any           { return c.get().Value(key) }

// end cancels the context once the claim has returned, and undoes the
// merge if it was made.
func (c *claimCtx) end() {
	c.mu.Lock()
	c.ended = true
	made := c.merged != nil && c.unreg != nil
	c.mu.Unlock()
	if made {
		c.unreg()
		c.cancel()
	}
}
