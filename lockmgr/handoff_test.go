package lockmgr

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestReleaseRunsTheWokenWaiter: a Release that wakes a waiter lets it run
// before Release returns, on the releasing thread. With one P, the waiter
// can run before the releaser blocks only if Release yields to it; so its
// grant is recorded by the time Release returns. The scheduler looks at its
// global queue first on one schedule in 61, and then resumes the releaser
// first: so most hand-offs of 50, not all, must show the grant. Control:
// with the yield a no-op, almost none does (a preemption of the releaser
// between the wake-up and the look, after a 10 ms stall of its thread,
// would let one through).
func TestReleaseRunsTheWokenWaiter(t *testing.T) {
	const rounds = 50
	for _, tc := range []struct {
		name    string
		yield   func()
		atLeast int
		atMost  int
	}{
		{"yield", runtime.Gosched, rounds * 4 / 5, rounds},
		{"control: no yield", func() {}, 0, rounds / 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tree, host := newFakeTree(), newMemHost()
			tree.add(100, 1)
			tree.add(200, 1)
			e := newTestEngine(t, tree, host)
			defer e.Close()
			e.yield = tc.yield
			ctx := context.Background()
			id := LockID{Path: "a/b/c/d", Kind: KindDir}
			holder, waiter := Owner{OwnerFile, 1}, Owner{OwnerFile, 2}
			early := 0
			for i := 0; i < rounds; i++ {
				if _, err := e.Acquire(ctx, Request{Lock: id, Mode: Exclusive, Owner: holder, TID: 100}); err != nil {
					t.Fatal(err)
				}
				var granted atomic.Bool
				errc := make(chan error, 1)
				go func() {
					_, err := e.Acquire(ctx, Request{Lock: id, Mode: Exclusive, Owner: waiter, TID: 200, Wait: true})
					granted.Store(true)
					errc <- err
				}()
				waitParked(t, e, 200)
				procs := runtime.GOMAXPROCS(1)
				err := e.Release(ctx, id, holder)
				if granted.Load() {
					early++
				}
				runtime.GOMAXPROCS(procs)
				if err != nil {
					t.Fatal(err)
				}
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
				if err := e.Release(ctx, id, waiter); err != nil {
					t.Fatal(err)
				}
			}
			if early < tc.atLeast || early > tc.atMost {
				t.Fatalf("waiter granted by the time Release returned in %d of %d hand-offs, want %d to %d",
					early, rounds, tc.atLeast, tc.atMost)
			}
		})
	}
}

// TestReleaseWithoutWaitersDoesNotYield: a Release that wakes nobody
// returns without yielding.
func TestReleaseWithoutWaitersDoesNotYield(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	e := newTestEngine(t, tree, host)
	defer e.Close()
	var yields int
	e.yield = func() { yields++ }
	ctx := context.Background()
	id := LockID{Path: "a/b", Kind: KindDir}
	for i := 0; i < 3; i++ {
		if _, err := e.Acquire(ctx, Request{Lock: id, Mode: Exclusive, Owner: Owner{OwnerFile, 1}, TID: 100}); err != nil {
			t.Fatal(err)
		}
		if err := e.Release(ctx, id, Owner{OwnerFile, 1}); err != nil {
			t.Fatal(err)
		}
	}
	if yields != 0 {
		t.Fatalf("%d yields without a waiter, want 0", yields)
	}
}

// waitParked waits until thread tid sleeps in the engine.
func waitParked(t *testing.T, e *Engine, tid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.mu.Lock()
		_, ok := e.parked[tid]
		e.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d never parked", tid)
		}
		time.Sleep(time.Millisecond)
	}
}
