package gcsbackend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// Two backends ("hosts") on one bucket: exclusive excludes everything,
// shared claims coexist, a release lets the other in, and tokens grow.
func TestClaimsAcrossHosts(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	a := newBackend(t, emu, nil)
	b := newBackend(t, emu, nil)
	ctx := ctxT(t, 30*time.Second)
	id := dirLock("a/b")

	la, err := a.Claim(ctx, id, lockmgr.Exclusive, false)
	if err != nil {
		t.Fatal(err)
	}
	ta, err := la.NextToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []lockmgr.Mode{lockmgr.Shared, lockmgr.Exclusive} {
		if _, err := b.Claim(ctx, id, m, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
			t.Fatalf("B %v while A holds exclusive: %v, want ErrWouldBlock", m, err)
		}
	}
	// Control: another lock is free.
	lo, err := b.Claim(ctx, dirLock("a/c"), lockmgr.Exclusive, false)
	if err != nil {
		t.Fatalf("B on another lock: %v", err)
	}
	if err := lo.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A waiting claim gets the lock once A releases.
	got := make(chan lockmgr.Lease, 1)
	go func() {
		l, err := b.Claim(ctx, id, lockmgr.Exclusive, true)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("B was granted while A holds the lock")
	default:
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-got
	if lb == nil {
		t.FailNow()
	}
	tb, err := lb.NextToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tb <= ta {
		t.Fatalf("B's token %#x not above A's earlier %#x", tb, ta)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Shared claims of both hosts coexist; exclusive waits for both.
	sa, err := a.Claim(ctx, id, lockmgr.Shared, false)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Claim(ctx, id, lockmgr.Shared, false)
	if err != nil {
		t.Fatalf("shared with shared: %v", err)
	}
	if err := sb.Convert(ctx, lockmgr.Exclusive, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("upgrade while the other host shares: %v", err)
	}
	if sb.Mode() != lockmgr.Shared {
		t.Fatalf("failed upgrade left mode %v", sb.Mode())
	}
	if err := sa.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Convert(ctx, lockmgr.Exclusive, false); err != nil {
		t.Fatalf("upgrade alone: %v", err)
	}
	if _, err := a.Claim(ctx, id, lockmgr.Shared, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("shared after the other's upgrade: %v", err)
	}
	if err := sb.Convert(ctx, lockmgr.Shared, false); err != nil {
		t.Fatal(err)
	}
	sa2, err := a.Claim(ctx, id, lockmgr.Shared, false)
	if err != nil {
		t.Fatalf("shared after the other's downgrade: %v", err)
	}
	if d := sa2.(lockmgr.LeaseDescriber).Describe(); d == "" {
		t.Fatal("no description")
	} else {
		t.Logf("describe: %s", d)
	}
	_ = gcsbackend.Stats{}
	_ = context.Background
}
