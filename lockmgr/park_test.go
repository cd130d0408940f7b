package lockmgr

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestParkedWaitsHoldNoGoroutine: n threads queue for one lock through
// AcquireAsync. While they wait, no goroutine waits for them; every other
// one is cancelled (answered with the context's error, and gone from the
// queue); the rest are granted in their order of arrival when the holder
// lets go; and the waiters still queued when the engine closes are all
// answered ErrClosed, with no goroutine left. Control: the same waits
// through Acquire, one goroutine each.
func TestParkedWaitsHoldNoGoroutine(t *testing.T) {
	const n = 200
	for _, mode := range []string{"parked", "control-goroutines"} {
		t.Run(mode, func(t *testing.T) {
			testutil.CheckGoroutines(t)
			e, err := New(Config{Backend: &memBackend{host: newMemHost()}, Processes: threadsTree{}})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			id := LockID{Path: "a", Kind: KindDir}
			req := func(i int) Request {
				return Request{Lock: id, Mode: Exclusive, Owner: Owner{OwnerFile, uint64(i + 1)}, TID: 1000 + i, Wait: true, Ino: 7}
			}
			if _, err := e.Acquire(context.Background(), req(0)); err != nil {
				t.Fatal(err)
			}

			var mu sync.Mutex
			var granted []int
			errs := make(chan error, n)
			cancels := make([]context.CancelFunc, n+1)
			base := runtime.NumGoroutine()
			for i := 1; i <= n; i++ {
				ctx, cancel := context.WithCancel(context.Background())
				cancels[i] = cancel
				answer := func(_ Grant, err error) {
					if err == nil {
						mu.Lock()
						granted = append(granted, i)
						mu.Unlock()
						err = e.Release(context.Background(), id, req(i).Owner)
					}
					errs <- err
				}
				if mode == "parked" {
					e.AcquireAsync(ctx, req(i), answer)
				} else {
					go func() { answer(e.Acquire(ctx, req(i))) }()
					waitQueued(t, e, id, i) // arrival in the order of i
				}
			}
			waitQueued(t, e, id, n)
			extra := runtime.NumGoroutine() - base
			t.Logf("%s: %d goroutines more with %d waiters queued", mode, extra, n)
			switch {
			case mode == "parked" && extra > n/10:
				t.Errorf("%d goroutines more with %d parked waiters queued, want about none", extra, n)
			case mode != "parked" && extra < n*3/4:
				t.Errorf("control: only %d goroutines more with %d waiters on goroutines: the test cannot tell", extra, n)
			}

			for i := 1; i <= n; i += 2 {
				cancels[i]()
			}
			for range n / 2 {
				if err := <-errs; !errors.Is(err, context.Canceled) {
					t.Fatalf("a cancelled wait answered %v, want context.Canceled", err)
				}
			}
			waitQueued(t, e, id, n/2)

			if err := e.Release(context.Background(), id, req(0).Owner); err != nil {
				t.Fatal(err)
			}
			for range n / 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if !slices.IsSorted(granted) || len(granted) != n/2 {
				t.Errorf("granted in the order %v, want the %d uncancelled waiters in their order of arrival", granted, n/2)
			}
			for _, c := range cancels[1:] {
				c()
			}

			// Waiters still queued when the engine closes.
			if _, err := e.Acquire(context.Background(), req(0)); err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= n; i++ {
				answer := func(_ Grant, err error) { errs <- err }
				if mode == "parked" {
					e.AcquireAsync(context.Background(), req(i), answer)
				} else {
					go func() { answer(e.Acquire(context.Background(), req(i))) }()
				}
			}
			waitQueued(t, e, id, n)
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			for range n {
				if err := <-errs; !errors.Is(err, ErrClosed) {
					t.Fatalf("a wait queued at Close answered %v, want ErrClosed", err)
				}
			}
		})
	}
}

// waitQueued waits until n waiters are queued for id.
func waitQueued(t *testing.T, e *Engine, id LockID, n int) {
	t.Helper()
	queued := -1
	if !testutil.Poll(time.Minute, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		queued = 0
		if ls := e.locks[id]; ls != nil {
			queued = ls.queueLenLocked()
		}
		return queued == n
	}) {
		t.Fatalf("%d waiters queued, want %d", queued, n)
	}
}
