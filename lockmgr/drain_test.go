package lockmgr

import (
	"context"
	"testing"
	"time"
)

// threadsTree is a ProcessTree in which every thread id belongs to process
// 100, a child of init: a thread pool.
type threadsTree struct{}

func (threadsTree) Lineage(tid int) (Lineage, error) {
	return Lineage{{PID: 100, Start: 1}, {PID: 1, Start: 1}}, nil
}

func (threadsTree) Alive(ProcID) bool { return true }

// TestDrainOfOneProcessThreads: n threads of one process queue for one
// lock, each through its own open file description (they exclude each
// other, as in the kernel), and the queue drains. Each grant wakes only
// the waiters it may let in: about one wake-up per waiter. Before, a
// grant woke every queued thread of the holder's process (they may jump
// the queue when their lineage holds the lock, but a hold of another
// description of the same control file blocks them), n²/2 wake-ups to
// drain. Control: waking them all (wakeBlockedUnder) costs that.
func TestDrainOfOneProcessThreads(t *testing.T) {
	const n = 300
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "fixed", true: "control-wake-all"}[control], func(t *testing.T) {
			if control {
				defer func(old bool) { wakeBlockedUnder = old }(wakeBlockedUnder)
				wakeBlockedUnder = true
			}
			e, err := New(Config{Backend: &memBackend{host: newMemHost()}, Processes: threadsTree{}})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			id := LockID{Path: "a", Kind: KindDir}
			req := func(i int) Request {
				return Request{Lock: id, Mode: Exclusive, Owner: Owner{OwnerFile, uint64(i + 1)}, TID: 1000 + i, Wait: true, Ino: 7}
			}
			if _, err := e.Acquire(ctx, req(0)); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, n)
			for i := 1; i <= n; i++ {
				go func() {
					if _, err := e.Acquire(ctx, req(i)); err != nil {
						done <- err
						return
					}
					done <- e.Release(ctx, id, req(i).Owner)
				}()
			}
			for {
				e.mu.Lock()
				queued := 0
				if ls := e.locks[id]; ls != nil {
					queued = ls.nQueue
				}
				e.mu.Unlock()
				if queued == n {
					break
				}
				time.Sleep(time.Millisecond)
			}
			e.mu.Lock()
			before := e.wakes
			e.mu.Unlock()
			if err := e.Release(ctx, id, req(0).Owner); err != nil {
				t.Fatal(err)
			}
			for range n {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			e.mu.Lock()
			wakes := e.wakes - before
			e.mu.Unlock()
			t.Logf("%d wake-ups to drain %d threads of one process", wakes, n)
			bound := uint64(4 * n)
			if !control && wakes > bound {
				t.Errorf("%d wake-ups to drain %d waiters, want at most %d", wakes, n, bound)
			}
			if control && wakes <= bound {
				t.Errorf("control: waking every thread of the holder's process took only %d wake-ups: the test cannot tell", wakes)
			}
		})
	}
}
