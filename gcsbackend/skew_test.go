package gcsbackend_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// Wall clocks offset by ±2×TTL between two hosts change nothing: the other
// host never gets the lock while its holder heartbeats, and gets it about
// the TTL after the holder's last heartbeat once the holder crashes, never
// before. The control turns on a design that judges expiry by comparing
// the holder's wall-clock heartbeat time with the local wall clock: with
// the same offsets it grants the lock at once, and the test sees it.
func TestClockOffsetChangesNothing(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	for _, tc := range []struct {
		name         string
		holder, peer time.Duration
		unsafe       bool
	}{
		{"holder behind", -2 * testTTL, 2 * testTTL, false},
		{"holder ahead", 2 * testTTL, -2 * testTTL, false},
		{"control wall-clock expiry", -2 * testTTL, 2 * testTTL, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newBackend(t, emu, func(c *gcsbackend.Config) { c.ClockOffset = tc.holder })
			b := newBackend(t, emu, func(c *gcsbackend.Config) { c.ClockOffset = tc.peer })
			b.SetUnsafeWallExpiry(tc.unsafe)
			ctx := ctxT(t, 30*time.Second)
			id := dirLock("skew")
			if _, err := a.Claim(ctx, id, lockmgr.Exclusive, false); err != nil {
				t.Fatal(err)
			}
			violated := false
			for i := 0; i < 15 && !violated; i++ {
				l, err := b.Claim(ctx, id, lockmgr.Exclusive, false)
				switch {
				case err == nil:
					violated = true
					l.Release(ctx)
				case !errors.Is(err, lockmgr.ErrWouldBlock):
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if violated != tc.unsafe {
				t.Fatalf("peer granted while the holder refreshes: %v, want %v", violated, tc.unsafe)
			}
			if tc.unsafe {
				t.Log("control: wall-clock expiry granted the lock to the peer while the holder held it")
				return
			}
			crashed := time.Now()
			a.Crash()
			lastBeat := emu.LastHeartbeat(t, a.Config().Prefix, a.HostID())
			for {
				_, err := b.Claim(ctx, id, lockmgr.Exclusive, false)
				if err == nil {
					break
				}
				if !errors.Is(err, lockmgr.ErrWouldBlock) {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			d := time.Since(lastBeat)
			t.Logf("taken over %v after the last heartbeat, %v after the crash", d.Round(time.Millisecond), time.Since(crashed).Round(time.Millisecond))
			if d < testTTL-100*time.Millisecond || d > testTTL+4*time.Second {
				t.Errorf("taken over %v after the last heartbeat; want about the TTL (%v), never before", d, testTTL)
			}
		})
	}
}
