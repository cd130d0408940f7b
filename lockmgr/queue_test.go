package lockmgr

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// spinUntil waits for cond without sleeping between looks (the engine
// settles in microseconds), failing t after d.
func spinUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
		runtime.Gosched()
	}
}

// TestManyWaitersDrain: 10,000 waiters queue on one lock, one in seven is
// interrupted while queued, and the rest are granted one by one in arrival
// order as each releases. Granting costs O(1) per release (only the head is
// woken), so the whole drain takes about as long as 10,000 uncontended
// acquire/release pairs.
//
// The bound (two minutes on a loaded machine) only detects hangs and
// quadratic behaviour. Control: the engine before the per-waiter queue
// (every change woke every waiter, and each rescanned the queue and the
// holds; 100 ms recheck timers) drained 1,500 waiters at 8 grants in 20 s,
// and does not finish this test within its bound.
func TestManyWaitersDrain(t *testing.T) {
	testutil.CheckGoroutines(t)
	const n = 10000
	tree, host := newFakeTree(), newMemHost()
	e := newTestEngine(t, tree, host)
	defer e.Close()
	ctx := context.Background()
	id := LockID{Path: "a", Kind: KindDir}
	tree.add(2, 1)
	holder := Owner{OwnerFile, 1}
	if _, err := e.Acquire(ctx, Request{Lock: id, Mode: Exclusive, Owner: holder, TID: 2}); err != nil {
		t.Fatal(err)
	}
	queued := func() int {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.waiting)
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	cancels := make([]context.CancelFunc, n)
	errs := make(chan error, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		pid := 1000 + i
		tree.add(pid, 1)
		wctx, cancel := context.WithCancel(ctx)
		cancels[i] = cancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := Owner{OwnerFile, uint64(pid)}
			_, err := e.Acquire(wctx, Request{Lock: id, Mode: Exclusive, Owner: o, TID: pid, Wait: true})
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := e.Release(ctx, id, o); err != nil {
				errs <- err
			}
		}()
		// One at a time, so that the arrival order is known.
		spinUntil(t, time.Minute, "the waiter to queue", func() bool { return queued() == i+1 })
	}
	t.Logf("%d waiters queued in %v", n, time.Since(start))
	cancelled := 0
	for i := 3; i < n; i += 7 {
		cancels[i]()
		cancelled++
	}
	spinUntil(t, time.Minute, "the interrupted waiters to leave", func() bool { return queued() == n-cancelled })
	start = time.Now()
	if err := e.Release(ctx, id, holder); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("drain hung: %d of %d granted after 2 minutes", len(order), n-cancelled)
	}
	t.Logf("%d waiters drained in %v", n-cancelled, time.Since(start))
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("waiter: %v", err)
		}
	}
	if len(order) != n-cancelled {
		t.Fatalf("%d granted, want %d", len(order), n-cancelled)
	}
	for k := 1; k < len(order); k++ {
		if order[k] < order[k-1] {
			t.Fatalf("grant %d went to waiter %d after waiter %d: FIFO broken", k, order[k], order[k-1])
		}
	}
	for _, c := range cancels {
		c()
	}
	if st := e.Status(id); len(st.Holders) != 0 || len(st.Waiters) != 0 {
		t.Errorf("after the drain: %d holders, %d waiters", len(st.Holders), len(st.Waiters))
	}
}
