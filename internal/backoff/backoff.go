// Package backoff is lockfs's one retry and poll backoff: jittered,
// bounded, exponential, sleeping on an injected clock so that tests can run
// a retry loop without waiting.
package backoff

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Backoff yields the waits of a retry or poll loop: each is drawn
// uniformly from [d/2, d], and d doubles from min up to max. Jitter keeps
// many waiters from polling in step. It is not safe for concurrent use;
// each loop has its own.
type Backoff struct {
	min, max, d time.Duration
}

// New returns a backoff that starts at min and grows to max.
func New(min, max time.Duration) *Backoff {
	return &Backoff{min: min, max: max, d: min}
}

// Next returns the next wait and doubles the one after, up to max.
func (b *Backoff) Next() time.Duration {
	d := b.d
	b.d = min(2*b.d, b.max)
	return d/2 + rand.N(d/2+1)
}

// Reset starts over from min.
func (b *Backoff) Reset() { b.d = b.min }

// Sleep waits b.Next() on timers (see Sleep).
func (b *Backoff) Sleep(ctx context.Context, timers Timers, stop <-chan struct{}) error {
	return Sleep(ctx, timers, b.Next(), stop)
}

// Timers makes the timers a wait sleeps on: a backend's clock (it has
// this method), or a test's clock advanced by hand. Nil means Go timers.
type Timers interface {
	// Timer returns a channel that is closed once d has passed, and a
	// function that releases the timer if it has not fired.
	Timer(d time.Duration) (c <-chan struct{}, stop func())
}

// ErrStopped is Sleep's error when its stop channel closed first.
var ErrStopped = errors.New("backoff: stopped")

// Sleep waits d on timers (Go timers when nil), or until ctx ends (its
// error) or stop is closed (ErrStopped); a nil stop never closes. A d of
// zero or less returns at once with ctx's error, if any.
func Sleep(ctx context.Context, timers Timers, d time.Duration, stop <-chan struct{}) error {
	if d <= 0 {
		return ctx.Err()
	}
	if timers == nil {
		timers = goTimers{}
	}
	c, release := timers.Timer(d)
	defer release()
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return ErrStopped
	}
}

// Jitter returns d give or take a tenth, drawn uniformly, so that periodic
// work of many hosts (heartbeats, polls) spreads out while its mean rate
// stays one per d.
func Jitter(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}

// goTimers are Go's timers.
type goTimers struct{}

func (goTimers) Timer(d time.Duration) (<-chan struct{}, func()) {
	c := make(chan struct{})
	t := time.AfterFunc(d, func() { close(c) })
	return c, func() { t.Stop() }
}
