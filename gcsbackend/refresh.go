package gcsbackend

import (
	"errors"
	"time"

	"github.com/sirupsen/logrus"
)

// The refresher.
//
// One goroutine per backend serves every lease: it sleeps until the
// earliest instant any lease needs attention, then starts a refresh for
// each lease whose refresh is due (RefreshInterval after its last landed
// write was sent) and marks lost each lease whose validity (TTL-Margin
// after that send) has ended. A refresh runs in a goroutine of its own, so
// that one slow request delays no other lease; it is one conditional write
// on top of the lease's last version (no read unless another host wrote
// since), bounded by the lease's validity. A refresh that fails is retried
// after a short backoff until the validity ends. Close cancels the
// refresher and waits for it and its refreshes.

// idleWake is how long the refresher sleeps with no lease to look after.
const idleWake = time.Minute

// refreshRetry is the wait before retrying a refresh that failed without
// losing the lease.
const refreshRetry = 200 * time.Millisecond

func (b *Backend) refresher() {
	defer b.workers.Done()
	for {
		now := b.clock.Now()
		next := now + idleWake
		b.mu.Lock()
		for l := range b.leases {
			at, start := l.schedule(now)
			if start {
				b.workers.Add(1)
				go b.refresh(l)
			}
			if at != 0 {
				next = min(next, at)
			}
		}
		b.mu.Unlock()
		c, stop := b.clock.Timer(max(next-now, time.Millisecond))
		select {
		case <-c:
		case <-b.kick:
		case <-b.closeCtx.Done():
			stop()
			return
		}
		stop()
	}
}

// schedule looks at the lease at now: it marks it lost if its validity has
// ended, and says whether a refresh should start, and when to look again
// (0: never).
func (l *lease) schedule(now time.Duration) (at time.Duration, start bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checkLocked(now)
	if l.lostErr != nil || l.released {
		return 0, false
	}
	if !l.refreshing && now >= l.refreshDue {
		l.refreshing, start = true, true
	}
	if l.refreshing {
		return l.validUntil, start
	}
	return min(l.refreshDue, l.validUntil), false
}

// refresh refreshes one lease and tells the refresher when it is done.
func (b *Backend) refresh(l *lease) {
	defer b.workers.Done()
	defer b.wake()
	err := l.update(b.closeCtx, updateOpts{try: true})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refreshing = false
	switch {
	case err == nil:
		b.stats.refreshes.Add(1)
	case errors.Is(err, errBusy):
		// Another write of the claim is in flight; it refreshes too.
		l.refreshDue = b.clock.Now() + refreshRetry
	case l.lostErr != nil || l.released || b.closeCtx.Err() != nil:
	default:
		l.refreshDue = b.clock.Now() + refreshRetry
		b.log.WithError(err).WithFields(logrus.Fields{"lock": l.id.String()}).Warn("refresh failed; retrying")
	}
}
