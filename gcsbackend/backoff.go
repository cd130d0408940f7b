package gcsbackend

import (
	"context"
	"time"

	"github.com/lockfs/lockfs/internal/backoff"
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

// newPoll returns a waiter's backoff: from pollMin up to pollMax, or an
// eighth of the TTL if that is less, so that a waiter notices a holder's
// last heartbeat within a small part of the time it then waits for it to
// turn stale.
func (b *Backend) newPoll() *backoff.Backoff {
	return backoff.New(pollMin, max(pollMin, min(pollMax, b.cfg.TTL/8)))
}

// sleep waits d on the backend's clock, or until ctx ends.
func (b *Backend) sleep(ctx context.Context, d time.Duration) error {
	return backoff.Sleep(ctx, b.clock, d, nil)
}
