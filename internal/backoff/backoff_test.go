package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestNextBounds: every wait lies in [d/2, d] for a d that doubles from
// min up to max, and Reset starts over.
func TestNextBounds(t *testing.T) {
	b := New(time.Millisecond, 50*time.Millisecond)
	want := []time.Duration{1, 2, 4, 8, 16, 32, 50, 50}
	for round := 0; round < 2; round++ {
		for i, d := range want {
			d *= time.Millisecond
			if got := b.Next(); got < d/2 || got > d {
				t.Fatalf("round %d wait %d: %v, want within [%v, %v]", round, i, got, d/2, d)
			}
		}
		b.Reset()
	}
}

// handTimers fire only when the test closes them.
type handTimers struct{ made chan chan struct{} }

func (h handTimers) Timer(time.Duration) (<-chan struct{}, func()) {
	c := make(chan struct{})
	h.made <- c
	return c, func() {}
}

// TestSleepInjectedClock: Sleep waits on the injected timer, not on the
// wall clock, and ends early on ctx or stop; the control is a timer the
// test fires.
func TestSleepInjectedClock(t *testing.T) {
	h := handTimers{made: make(chan chan struct{}, 1)}
	done := make(chan error, 1)
	go func() { done <- Sleep(context.Background(), h, time.Hour, nil) }()
	c := <-h.made
	select {
	case err := <-done:
		t.Fatalf("Sleep returned %v before its timer fired", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(c)
	if err := <-done; err != nil {
		t.Fatalf("Sleep after its timer fired: %v", err)
	}

	stop := make(chan struct{})
	go func() { done <- Sleep(context.Background(), h, time.Hour, stop) }()
	<-h.made
	close(stop)
	if err := <-done; !errors.Is(err, ErrStopped) {
		t.Fatalf("Sleep after stop: %v, want ErrStopped", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- Sleep(ctx, h, time.Hour, nil) }()
	<-h.made
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep after cancel: %v, want context.Canceled", err)
	}
	if err := Sleep(context.Background(), nil, time.Millisecond, nil); err != nil {
		t.Fatalf("Sleep on Go timers: %v", err)
	}
}
