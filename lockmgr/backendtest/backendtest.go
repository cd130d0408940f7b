// Package backendtest is the conformance suite of lockmgr.Backend: one set
// of tests that every implementation runs (the engine's in-memory fake,
// localbackend, gcsbackend), so that the fake the engine's tests rely on
// is proven to behave like the real backends, and the real backends like
// the contract lockmgr.Backend documents.
//
// Waits are checked for correctness only: a wait that should block is
// checked not to have returned at the moment the holder releases, and to
// return after, within a generous bound.
package backendtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// Pair returns two backends over one shared lock table, as two daemons on
// one host (or two hosts) see it. The suite closes both; the factory must
// not. The locks used are "a" and "b" (kind dir, siblings under the root),
// and "a" of kind newdir; a backend that needs their directories to exist
// must create them.
type Pair func(t *testing.T) (a, b lockmgr.Backend)

// bound is how long a wait that must end is given (a hang detector).
const bound = 30 * time.Second

var (
	lockA = lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}
	lockB = lockmgr.LockID{Path: "b", Kind: lockmgr.KindDir}
)

// Run runs the suite against backends made by newPair.
func Run(t *testing.T, newPair Pair) {
	for _, tc := range []struct {
		name string
		f    func(t *testing.T, a, b lockmgr.Backend)
	}{
		{"ExclusiveExcludes", exclusiveExcludes},
		{"SharedCoexists", sharedCoexists},
		{"WaitingClaimIsGrantedOnRelease", waitingClaim},
		{"CancelledWaitLeavesNothing", cancelledWait},
		{"DowngradeLetsSharedIn", downgrade},
		{"TokensIncrease", tokens},
		{"ReleaseEndsTheLease", releaseEnds},
		{"CloseReleasesEveryClaim", closeReleases},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newPair(t)
			closed := map[lockmgr.Backend]bool{}
			t.Cleanup(func() {
				for _, be := range []lockmgr.Backend{a, b} {
					if !closed[be] {
						if err := be.Close(); err != nil {
							t.Errorf("close: %v", err)
						}
					}
				}
			})
			if tc.name == "CloseReleasesEveryClaim" {
				closed[a] = true // the test closes it
			}
			tc.f(t, a, b)
		})
	}
}

func ctx() context.Context { return context.Background() }

func claim(t *testing.T, be lockmgr.Backend, id lockmgr.LockID, mode lockmgr.Mode) lockmgr.Lease {
	t.Helper()
	l, err := be.Claim(ctx(), id, mode, false)
	if err != nil {
		t.Fatalf("claim %s %s: %v", mode, id, err)
	}
	if l.Mode() != mode {
		t.Fatalf("claim %s %s: lease mode %s", mode, id, l.Mode())
	}
	return l
}

func release(t *testing.T, l lockmgr.Lease) {
	t.Helper()
	if err := l.Release(ctx()); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// refused checks that a non-blocking claim fails with ErrWouldBlock.
func refused(t *testing.T, be lockmgr.Backend, id lockmgr.LockID, mode lockmgr.Mode) {
	t.Helper()
	l, err := be.Claim(ctx(), id, mode, false)
	if err == nil {
		l.Release(ctx())
		t.Fatalf("claim %s %s was granted, want ErrWouldBlock", mode, id)
	}
	if !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("claim %s %s: %v, want ErrWouldBlock", mode, id, err)
	}
}

// eventuallyClaim retries a non-blocking claim until it is granted (a
// release may reach the shared table asynchronously).
func eventuallyClaim(t *testing.T, be lockmgr.Backend, id lockmgr.LockID, mode lockmgr.Mode) lockmgr.Lease {
	t.Helper()
	var l lockmgr.Lease
	var last error
	testutil.EventuallyWithin(t, bound, fmt.Sprintf("claim %s %s to be granted (last: %v)", mode, id, last), func() bool {
		l, last = be.Claim(ctx(), id, mode, false)
		return last == nil
	})
	return l
}

func exclusiveExcludes(t *testing.T, a, b lockmgr.Backend) {
	la := claim(t, a, lockA, lockmgr.Exclusive)
	refused(t, b, lockA, lockmgr.Exclusive)
	refused(t, b, lockA, lockmgr.Shared)
	// Control: another lock is free, and so is a's once released.
	lb := claim(t, b, lockB, lockmgr.Exclusive)
	release(t, lb)
	if d := la.Done(); d != nil {
		select {
		case <-d:
			t.Fatal("a held lease reports itself lost")
		default:
		}
	}
	if err := la.Err(); err != nil {
		t.Fatalf("a held lease: Err %v", err)
	}
	release(t, la)
	release(t, eventuallyClaim(t, b, lockA, lockmgr.Exclusive))
}

func sharedCoexists(t *testing.T, a, b lockmgr.Backend) {
	la := claim(t, a, lockA, lockmgr.Shared)
	lb := claim(t, b, lockA, lockmgr.Shared)
	// An upgrade against the other's shared claim fails without waiting
	// and keeps the shared claim.
	if err := lb.Convert(ctx(), lockmgr.Exclusive, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
		t.Fatalf("upgrade against a shared claim: %v, want ErrWouldBlock", err)
	}
	if lb.Mode() != lockmgr.Shared {
		t.Fatalf("after a refused upgrade: mode %s, want shared", lb.Mode())
	}
	refused(t, a, lockA, lockmgr.Exclusive)
	release(t, la)
	testutil.EventuallyWithin(t, bound, "the upgrade to be granted once alone", func() bool {
		return lb.Convert(ctx(), lockmgr.Exclusive, false) == nil
	})
	if lb.Mode() != lockmgr.Exclusive {
		t.Fatalf("after the upgrade: mode %s", lb.Mode())
	}
	refused(t, a, lockA, lockmgr.Shared)
	release(t, lb)
}

func waitingClaim(t *testing.T, a, b lockmgr.Backend) {
	la := claim(t, a, lockA, lockmgr.Exclusive)
	type result struct {
		l   lockmgr.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := b.Claim(ctx(), lockA, lockmgr.Exclusive, true)
		done <- result{l, err}
	}()
	// Give the wait a chance to go wrong, then check it is still waiting.
	time.Sleep(100 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("a waiting claim returned while the lock was held: %v", r.err)
	default:
	}
	release(t, la)
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("waiting claim: %v", r.err)
		}
		if r.l.Mode() != lockmgr.Exclusive {
			t.Fatalf("waiting claim: mode %s", r.l.Mode())
		}
		release(t, r.l)
	case <-time.After(bound):
		t.Fatal("a waiting claim was not granted after the release")
	}
}

func cancelledWait(t *testing.T, a, b lockmgr.Backend) {
	la := claim(t, a, lockA, lockmgr.Exclusive)
	c, cancel := context.WithCancel(ctx())
	done := make(chan error, 1)
	go func() {
		l, err := b.Claim(c, lockA, lockmgr.Exclusive, true)
		if err == nil {
			l.Release(ctx())
		}
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled wait: %v, want context.Canceled", err)
		}
	case <-time.After(bound):
		t.Fatal("a cancelled wait did not return")
	}
	// The abandoned wait left no claim: once a releases, a's lock is free
	// for a again.
	release(t, la)
	release(t, eventuallyClaim(t, a, lockA, lockmgr.Exclusive))
}

func downgrade(t *testing.T, a, b lockmgr.Backend) {
	la := claim(t, a, lockA, lockmgr.Exclusive)
	refused(t, b, lockA, lockmgr.Shared)
	if err := la.Convert(ctx(), lockmgr.Shared, false); err != nil {
		t.Fatalf("downgrade: %v", err)
	}
	if la.Mode() != lockmgr.Shared {
		t.Fatalf("after the downgrade: mode %s", la.Mode())
	}
	lb := eventuallyClaim(t, b, lockA, lockmgr.Shared)
	// Shared with shared now; exclusive still excluded.
	refused(t, b, lockA, lockmgr.Exclusive)
	release(t, lb)
	release(t, la)
}

func tokens(t *testing.T, a, b lockmgr.Backend) {
	la := claim(t, a, lockA, lockmgr.Exclusive)
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var max uint64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok, err := la.NextToken(ctx())
			if err != nil {
				t.Errorf("token: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[tok] {
				t.Errorf("token %d handed out twice", tok)
			}
			seen[tok] = true
			if tok > max {
				max = tok
			}
		}()
	}
	wg.Wait()
	release(t, la)
	// The other daemon's next grant on the lock gets a greater token.
	lb := eventuallyClaim(t, b, lockA, lockmgr.Exclusive)
	tok, err := lb.NextToken(ctx())
	if err != nil {
		t.Fatal(err)
	}
	if tok <= max {
		t.Fatalf("token %d after %d: tokens must increase across daemons", tok, max)
	}
	release(t, lb)
}

func releaseEnds(t *testing.T, a, b lockmgr.Backend) {
	la := claim(t, a, lockA, lockmgr.Exclusive)
	release(t, la)
	if la.Mode() != 0 {
		t.Fatalf("mode after release: %s, want none", la.Mode())
	}
	release(t, eventuallyClaim(t, b, lockA, lockmgr.Exclusive))
}

func closeReleases(t *testing.T, a, b lockmgr.Backend) {
	claim(t, a, lockA, lockmgr.Exclusive)
	claim(t, a, lockB, lockmgr.Shared)
	refused(t, b, lockB, lockmgr.Exclusive)
	if err := a.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	release(t, eventuallyClaim(t, b, lockA, lockmgr.Exclusive))
	release(t, eventuallyClaim(t, b, lockB, lockmgr.Exclusive))
}
