package gcsbackend

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff bounds.
const (
	// retryMin and retryMax bound the wait before retrying a request that
	// failed with 429, 5xx or no answer.
	retryMin = 50 * time.Millisecond
	retryMax = time.Second
	// conflictMin is where the backoff after a 412 starts.
	conflictMin = 20 * time.Millisecond
	// pollMin and pollMax bound the wait between two reads of a waiter.
	pollMin = 50 * time.Millisecond
	pollMax = time.Second
)

// backoff is a jittered, bounded exponential backoff: each wait is drawn
// uniformly from [d/2, d], and d doubles from min up to max.
type backoff struct {
	min, max, d time.Duration
}

func (b *Backend) newBackoff(lo, hi time.Duration) *backoff {
	return &backoff{min: lo, max: hi, d: lo}
}

// next returns the next wait.
func (bo *backoff) next() time.Duration {
	d := bo.d
	bo.d = min(2*bo.d, bo.max)
	return d/2 + rand.N(d/2+1)
}

// reset starts over from min.
func (bo *backoff) reset() { bo.d = bo.min }

// newPoll returns a waiter's backoff: from pollMin up to pollMax, or an
// eighth of the TTL if that is less, so that a waiter notices a holder's
// last heartbeat within a small part of the time it then waits for it to
// turn stale.
func (b *Backend) newPoll() *backoff {
	return b.newBackoff(pollMin, max(pollMin, min(pollMax, b.cfg.TTL/8)))
}

// jitter returns d give or take a tenth, drawn uniformly, so that periodic
// work of many hosts (heartbeats, want polls) spreads out while its mean
// rate stays one per d (a heartbeat every second must not exceed GCS's one
// write per second per object on average).
func jitter(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}

// sleep waits d on the backend's clock, or until ctx ends.
func (b *Backend) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	c, stop := b.clock.Timer(d)
	defer stop()
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
