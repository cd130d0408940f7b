package gcstest

import (
	"sort"
	"sync"
	"time"
)

// FakeClock is a monotonic clock that moves only when Advance is called. It
// implements the gcs backend's Clock, so a test can run a lease through its
// whole life without sleeping. It is safe for concurrent use.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Duration // GUARDED_BY(mu)
	timers []*fakeTimer  // pending, GUARDED_BY(mu)
	// added is closed and replaced whenever a timer is added.
	added chan struct{} // GUARDED_BY(mu)
}

type fakeTimer struct {
	at time.Duration
	c  chan struct{}
}

// NewFakeClock returns a clock reading start.
func NewFakeClock(start time.Duration) *FakeClock {
	return &FakeClock{now: start, added: make(chan struct{})}
}

// Now returns the clock's reading.
func (c *FakeClock) Now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Timer returns a channel that is closed once the clock has advanced by d,
// and a function that cancels it.
func (c *FakeClock) Timer(d time.Duration) (<-chan struct{}, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now + d, c: make(chan struct{})}
	if d <= 0 {
		close(t.c)
		return t.c, func() {}
	}
	c.timers = append(c.timers, t)
	close(c.added)
	c.added = make(chan struct{})
	return t.c, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, x := range c.timers {
			if x == t {
				c.timers = append(c.timers[:i], c.timers[i+1:]...)
				return
			}
		}
	}
}

// Advance moves the clock forward by d and fires the timers that are due,
// earliest first.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now += d
	sort.Slice(c.timers, func(i, j int) bool { return c.timers[i].at < c.timers[j].at })
	n := 0
	for _, t := range c.timers {
		if t.at <= c.now {
			close(t.c)
			continue
		}
		c.timers[n] = t
		n++
	}
	c.timers = c.timers[:n]
}

// Pending returns the number of timers not yet fired or cancelled.
func (c *FakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitTimers blocks until at least n timers are pending or timeout passes
// (in real time), and reports whether they are.
func (c *FakeClock) WaitTimers(n int, timeout time.Duration) bool {
	deadline := time.After(timeout)
	for {
		c.mu.Lock()
		ok, added := len(c.timers) >= n, c.added
		c.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-added:
		case <-deadline:
			return false
		}
	}
}
