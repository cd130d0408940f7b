package gcsbackend_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// waitFor polls cond in real time; the fake clocks do not move by themselves.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A lease's whole life on a fake clock, without sleeping: refreshed every
// TTL/3, lost once TTL-margin has passed since the last refresh was sent;
// and reading as lost at once even before the refresher runs.
func TestLeaseLifeOnFakeClock(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	clock := gcstest.NewFakeClock(time.Hour)
	b := newBackend(t, emu, func(c *gcsbackend.Config) { c.TTL = 30 * time.Second; c.Clock = clock })
	ctx := ctxT(t, 30*time.Second)
	l, err := b.Claim(ctx, dirLock("life"), lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	if s := gcsbackend.LeaseSeq(l); s != 1 {
		t.Fatalf("seq %d after the claim", s)
	}
	for i := 2; i <= 4; i++ {
		clock.WaitTimers(1, 5*time.Second)
		clock.Advance(10 * time.Second)
		waitFor(t, "a refresh", func() bool { return gcsbackend.LeaseSeq(l) == uint64(i) })
	}
	if err := l.Err(); err != nil {
		t.Fatalf("after three refreshes: %v", err)
	}
	d := l.(lockmgr.LeaseDescriber).Describe()
	if !strings.HasPrefix(d, "gcs exclusive seq=4") || !strings.Contains(d, "valid 27.0s") {
		t.Errorf("describe: %q", d)
	}
	// Jump past the validity: the lease reads as lost at once, before the
	// refresher has even woken, and then Done closes.
	clock.Advance(27 * time.Second)
	if err := l.Err(); !errors.Is(err, lockmgr.ErrLeaseLost) {
		t.Fatalf("Err after TTL-margin without refresh: %v", err)
	}
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed")
	}
	if l.Mode() != 0 {
		t.Errorf("mode %v after loss", l.Mode())
	}
	if _, err := l.NextToken(ctx); !errors.Is(err, lockmgr.ErrLeaseLost) {
		t.Errorf("NextToken after loss: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("release of a lost lease: %v", err)
	}
	if s := b.Stats(); s.Losses != 1 || s.Refreshes != 3 {
		t.Errorf("stats: %d losses, %d refreshes; want 1 and 3", s.Losses, s.Refreshes)
	}
}

// Expiry by observation, on fake clocks: a frozen holder (its clock never
// moves, so it neither refreshes nor gives up) blocks a peer's repeated
// non-blocking claims until the peer has seen its claim unchanged for
// TTL + refresh interval (40s at a 30s TTL), and not a millisecond less;
// a refresh seen meanwhile starts the count over.
func TestObservedExpiryOnFakeClock(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	ca, cb := gcstest.NewFakeClock(time.Hour), gcstest.NewFakeClock(5*time.Hour)
	a := newBackend(t, emu, func(c *gcsbackend.Config) { c.TTL = 30 * time.Second; c.Clock = ca })
	b := newBackend(t, emu, func(c *gcsbackend.Config) { c.TTL = 30 * time.Second; c.Clock = cb })
	ctx := ctxT(t, 30*time.Second)
	id := dirLock("frozen")
	la, err := a.Claim(ctx, id, lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	tryB := func() bool {
		_, err := b.Claim(ctx, id, lockmgr.Exclusive, false)
		if err != nil && !errors.Is(err, lockmgr.ErrWouldBlock) {
			t.Fatal(err)
		}
		return err == nil
	}
	if tryB() {
		t.Fatal("granted at first sight")
	}
	cb.Advance(30 * time.Second)
	// The holder refreshes once (its clock moves by one interval).
	ca.WaitTimers(1, 5*time.Second)
	ca.Advance(10 * time.Second)
	waitFor(t, "the holder's refresh", func() bool { return gcsbackend.LeaseSeq(la) == 2 })
	if tryB() {
		t.Fatal("granted 30s after first sight, with a refresh in between")
	}
	cb.Advance(40*time.Second - time.Millisecond)
	if tryB() {
		t.Fatal("granted 1ms before the refreshed claim turned stale")
	}
	cb.Advance(time.Millisecond)
	if !tryB() {
		t.Fatal("not granted once the claim was seen unchanged for TTL + refresh interval")
	}
	if s := b.Stats(); s.Takeovers != 1 {
		t.Errorf("%d takeovers", s.Takeovers)
	}
	// The frozen holder, thawed, finds its claim gone.
	ca.Advance(10 * time.Second)
	select {
	case <-la.Done():
		if !errors.Is(la.Err(), lockmgr.ErrLeaseLost) {
			t.Errorf("loss cause %v", la.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not notice its claim was taken over")
	}
}
