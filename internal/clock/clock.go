// Package clock is the monotonic clock the network backends (gcsbackend,
// etcdbackend) measure their sessions and leases with, and the host's
// CLOCK_BOOTTIME that implements it.
package clock

import (
	"time"

	"golang.org/x/sys/unix"
)

// Clock is a monotonic clock. A backend measures every lease duration with
// it and never compares readings of two hosts.
type Clock interface {
	// Now returns the time elapsed since a fixed, arbitrary origin. It never
	// goes backwards.
	Now() time.Duration
	// Timer returns a channel that is closed once d has passed on this
	// clock, and a function that releases the timer if it has not fired.
	Timer(d time.Duration) (c <-chan struct{}, stop func())
}

// Boot is the host's CLOCK_BOOTTIME: monotonic, and counting time spent
// in suspend. Its timers are Go timers, which may fire late after a
// suspend; a backend checks Now whenever it wakes, and before vouching.
type Boot struct{}

// Now reads CLOCK_BOOTTIME.
func (Boot) Now() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic("clock: clock_gettime(CLOCK_BOOTTIME): " + err.Error())
	}
	return time.Duration(ts.Nano())
}

// Timer is a Go timer.
func (Boot) Timer(d time.Duration) (<-chan struct{}, func()) {
	c := make(chan struct{})
	t := time.AfterFunc(d, func() { close(c) })
	return c, func() { t.Stop() }
}
