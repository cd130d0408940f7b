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

// A session's whole life on a fake clock, without sleeping: a heartbeat
// about every TTL/3 (±10%) keeps every lease valid; once TTL-margin has passed
// since the last heartbeat was sent, every lease reads as lost at once,
// even before the heartbeater runs, and Done closes on all of them; the
// next claim starts a new session.
func TestSessionLifeOnFakeClock(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	clock := gcstest.NewFakeClock(time.Hour)
	b := newBackend(t, emu, func(c *gcsbackend.Config) { c.TTL = 30 * time.Second; c.Clock = clock })
	ctx := ctxT(t, 30*time.Second)
	var leases []lockmgr.Lease
	for _, p := range []string{"life/a", "life/b", "other"} {
		l, err := b.Claim(ctx, dirLock(p), lockmgr.Exclusive, false)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	for i := 1; i <= 3; i++ {
		clock.WaitTimers(1, 5*time.Second)
		clock.Advance(11 * time.Second) // heartbeats come every 9 to 11s
		waitFor(t, "a heartbeat", func() bool { return b.Stats().Refreshes == uint64(i) })
	}
	for _, l := range leases {
		if err := l.Err(); err != nil {
			t.Fatalf("after three heartbeats: %v", err)
		}
	}
	d := leases[0].(lockmgr.LeaseDescriber).Describe()
	if !strings.HasPrefix(d, "gcs exclusive epoch=1 session=") || !strings.Contains(d, "valid 27.0s") {
		t.Errorf("describe: %q", d)
	}
	// Jump past the validity: every lease reads as lost at once, before
	// the heartbeater has even woken, and then every Done closes.
	clock.Advance(27 * time.Second)
	for _, l := range leases {
		if err := l.Err(); !errors.Is(err, lockmgr.ErrLeaseLost) {
			t.Fatalf("Err after TTL-margin without heartbeat: %v", err)
		}
	}
	for _, l := range leases {
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
	}
	if s := b.Stats(); s.Losses != 3 || s.Refreshes != 3 || s.Sessions != 1 {
		t.Errorf("stats: %d losses, %d heartbeats, %d sessions; want 3, 3 and 1", s.Losses, s.Refreshes, s.Sessions)
	}
	// A new session for the next claim; the lost session's own records do
	// not stand in its way.
	if _, err := b.Claim(ctx, dirLock("life/a"), lockmgr.Exclusive, false); err != nil {
		t.Fatalf("claim after the loss: %v", err)
	}
	if s := b.Stats(); s.Sessions != 2 {
		t.Errorf("%d sessions after the loss and a new claim, want 2", s.Sessions)
	}
}
