package etcdbackend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/etcdbackend/etcdtest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

func dir(p string) lockmgr.LockID    { return lockmgr.LockID{Path: p, Kind: lockmgr.KindDir} }
func newdir(p string) lockmgr.LockID { return lockmgr.LockID{Path: p, Kind: lockmgr.KindNewDir} }

func mustClaim(t *testing.T, b lockmgr.Backend, id lockmgr.LockID, m lockmgr.Mode) lockmgr.Lease {
	t.Helper()
	l, err := b.Claim(context.Background(), id, m, false)
	if err != nil {
		t.Fatalf("claim %s %s: %v", m, id, err)
	}
	return l
}

func mustRefuse(t *testing.T, b lockmgr.Backend, id lockmgr.LockID, m lockmgr.Mode) {
	t.Helper()
	l, err := b.Claim(context.Background(), id, m, false)
	if err == nil {
		l.Release(context.Background())
		t.Fatalf("claim %s %s granted, want ErrWouldBlock", m, id)
	}
	if !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("claim %s %s: %v, want ErrWouldBlock", m, id, err)
	}
}

// The hierarchy holds across hosts both ways: an exclusive claim on a
// directory excludes every claim inside it, and a claim inside excludes an
// exclusive claim above; shared ancestors do not. Controls: siblings and
// shared claims above are free.
func TestHierarchyAcrossHosts(t *testing.T) {
	c := etcdtest.Start(t)
	a, b := newBackend(t, c), newBackend(t, c)
	ctx := context.Background()

	la := mustClaim(t, a, dir("p"), lockmgr.Exclusive)
	mustRefuse(t, b, dir("p/q/r"), lockmgr.Shared)
	mustRefuse(t, b, newdir("p"), lockmgr.Exclusive)
	mustRefuse(t, b, dir("."), lockmgr.Exclusive)
	mustClaim(t, b, dir("."), lockmgr.Shared).Release(ctx)      // control: shared above
	mustClaim(t, b, dir("s/q"), lockmgr.Exclusive).Release(ctx) // control: a sibling tree
	la.Release(ctx)

	lb := mustClaim(t, b, dir("p/q/r"), lockmgr.Shared)
	// An exclusive claim above waits for the claim below; a shared one
	// does not (control).
	la2 := mustClaim(t, a, dir("p"), lockmgr.Shared)
	la2.Release(ctx)
	testutil.EventuallyWithin(t, 10*time.Second, "a's warm shared claim on p to be usable again", func() bool {
		l, err := a.Claim(ctx, dir("p"), lockmgr.Shared, false)
		if err == nil {
			l.Release(ctx)
		}
		return err == nil
	})
	mustRefuse(t, a, dir("p"), lockmgr.Exclusive)
	mustRefuse(t, a, dir("."), lockmgr.Exclusive)
	mustClaim(t, a, dir("p/q/x"), lockmgr.Exclusive).Release(ctx) // control: a sibling below

	// A waiting exclusive claim above is granted once the claim below goes.
	got := make(chan error, 1)
	go func() {
		l, err := a.Claim(ctx, dir("p"), lockmgr.Exclusive, true)
		if err == nil {
			l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("exclusive claim above a held claim returned: %v", err)
	default:
	}
	lb.Release(ctx)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting claim above was not granted after the release below")
	}

	// New-dir and usage locks hold their directory's lock shared.
	ln := mustClaim(t, a, newdir("n"), lockmgr.Exclusive)
	mustRefuse(t, b, dir("n"), lockmgr.Exclusive)
	mustClaim(t, b, dir("n"), lockmgr.Shared).Release(ctx) // control
	ln.Release(ctx)
}

// A cold claim at depth 4 costs one request once the session runs (the
// first claim starts it: one more), a warm re-take none; the warm key is
// given up as soon as another host asks for it. Control: with WarmFor < 0
// every round costs a claim and a drop.
func TestRequestCounts(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		warm  time.Duration
		round uint64 // requests per re-take and release
	}{{"warm", 0, 0}, {"cold", -1, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			a := newBackend(t, c, func(cfg *etcdbackend.Config) { cfg.WarmFor = tc.warm })
			mustClaim(t, a, dir("x"), lockmgr.Shared).Release(ctx) // starts the session
			quiet := func() uint64 { s := a.Stats(); return s.Requests - s.KeepAlives }
			// The session's start also lists the wants, in the background:
			// wait until it has (the grant, the claim and the listing: 3
			// requests) and nothing more comes.
			last, since := quiet(), time.Now()
			for last < 3 || time.Since(since) < 300*time.Millisecond {
				time.Sleep(20 * time.Millisecond)
				if n := quiet(); n != last {
					last, since = n, time.Now()
				}
			}
			before := quiet()
			l := mustClaim(t, a, dir("a/b/c/d"), lockmgr.Exclusive)
			if n := quiet() - before; n != 1 {
				t.Errorf("cold acquire at depth 4: %d requests, want 1", n)
			}
			l.Release(ctx)
			before = quiet()
			for range 20 {
				mustClaim(t, a, dir("a/b/c/d"), lockmgr.Exclusive).Release(ctx)
			}
			if n := quiet() - before; n != 20*tc.round {
				t.Errorf("20 rounds: %d requests, want %d", n, 20*tc.round)
			}
			if tc.warm < 0 {
				return
			}
			// Another host's waiting claim gets the warm key at once.
			b := newBackend(t, c)
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			lb, err := b.Claim(wctx, dir("a/b"), lockmgr.Exclusive, true)
			if err != nil {
				t.Fatalf("another host's claim over a warm key: %v", err)
			}
			lb.Release(ctx)
			// a counts the drop once its delete has returned, which may be
			// after b's watch saw the key go and b's claim went through.
			if !testutil.Poll(5*time.Second, func() bool { return a.Stats().Drops > 0 }) {
				t.Errorf("the warm key was not dropped: %+v", a.Stats())
			}
		})
	}
}
