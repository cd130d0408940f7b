package lockmgr

import (
	"context"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestObserverHearsOfYield: engine e1 holds f and has a local waiter
// queued (continuous demand); another engine's request for f waits for
// e1's lease. When the holder releases, e1 gives the lease up rather than
// hand it on, and its Observer hears of that once (lockfs_lock_yields_total).
// Control: with KeepContended, e1 hands the lease to its own waiter and
// nothing is reported.
func TestObserverHearsOfYield(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "yield", true: "control-keep"}[control], func(t *testing.T) {
			tree, host := newFakeTree(), newMemHost()
			for _, pid := range []int{100, 200, 300} {
				tree.add(pid, 1)
			}
			obs := &countingObserver{outcomes: map[Outcome]int{}}
			e1, err := New(Config{Backend: &memBackend{host: host}, Processes: tree, Observer: obs, KeepContended: control})
			if err != nil {
				t.Fatal(err)
			}
			defer e1.Close()
			e2, err := New(Config{Backend: &memBackend{host: host}, Processes: tree})
			if err != nil {
				t.Fatal(err)
			}
			defer e2.Close()
			ctx := context.Background()
			f := LockID{Path: "f", Kind: KindDir}
			req := func(owner uint64, tid int) Request {
				return Request{Lock: f, Mode: Exclusive, Owner: Owner{OwnerFile, owner}, TID: tid, Wait: true}
			}
			if _, err := e1.Acquire(ctx, req(1, 100)); err != nil {
				t.Fatal(err)
			}
			granted := make(chan string, 2)
			acquire := func(e *Engine, name string, r Request) {
				go func() {
					if _, err := e.Acquire(ctx, r); err != nil {
						t.Errorf("%s: %v", name, err)
					}
					granted <- name
					e.Release(ctx, f, r.Owner)
				}()
			}
			acquire(e1, "local", req(2, 200))
			testutil.Eventually(t, "the local request queued", func() bool {
				e1.mu.Lock()
				defer e1.mu.Unlock()
				return e1.locks[f] != nil && e1.locks[f].queueLenLocked() == 1
			})
			acquire(e2, "outside", req(3, 300))
			testutil.Eventually(t, "the other engine's claim waits", func() bool {
				host.mu.Lock()
				defer host.mu.Unlock()
				return len(host.waits) == 1
			})
			if err := e1.Release(ctx, f, Owner{OwnerFile, 1}); err != nil {
				t.Fatal(err)
			}
			var order []string
			for range 2 {
				select {
				case name := <-granted:
					order = append(order, name)
				case <-time.After(time.Minute):
					t.Fatalf("granted so far: %v", order)
				}
			}
			obs.mu.Lock()
			yields := obs.yields
			obs.mu.Unlock()
			want, first := 1, "outside"
			if control {
				want, first = 0, "local"
			}
			if yields != want || order[0] != first {
				t.Errorf("%d yields reported, grants in order %v; want %d, %s first", yields, order, want, first)
			}
		})
	}
}
