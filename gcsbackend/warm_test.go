package gcsbackend_test

import (
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/lockmgr"
)

// TestWarmRecordDroppedAfterWarmFor: a record released (kept warm) is
// dropped from its object once idle for WarmFor, by the want poller,
// while a record held meanwhile stays (the control: the poller does not
// drop what is in use). The record is held across a few polls before its
// release, so that a poller that lost track of a record once leased would
// never drop it.
func TestWarmRecordDroppedAfterWarmFor(t *testing.T) {
	emu := gcstest.Start(t)
	b := newBackend(t, emu, func(c *gcsbackend.Config) { c.WarmFor = time.Second })
	ctx := ctxT(t, 90*time.Second)
	held, warm := dirLock("held"), dirLock("warm")
	lh, err := b.Claim(ctx, held, lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	lw, err := b.Claim(ctx, warm, lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * 250 * time.Millisecond) // a few WantPolls with both in use
	if err := lw.Release(ctx); err != nil {
		t.Fatal(err)
	}
	claims := func(id lockmgr.LockID) int {
		t.Helper()
		cs, err := b.ListClaims(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return len(cs)
	}
	deadline := time.Now().Add(60 * time.Second)
	for claims(warm) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the warm record of %s is still there 60s after its release (WarmFor 1s)", warm)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := claims(held); n != 1 {
		t.Fatalf("the held record of %s: %d claims, want 1", held, n)
	}
	if err := lh.Err(); err != nil {
		t.Fatalf("held lease: %v", err)
	}
	if err := lh.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
