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
// the waiters it may let in, about one wake-up per waiter, and looks at
// no other waiter (the waiters are indexed by process and owner), about
// none per grant. Two controls: a grant that woke every queued thread of
// the holder's process (wakeBlockedUnder: they may jump the queue when
// their lineage holds the lock, but a hold of another description of the
// same control file blocks them) costs n²/2 wake-ups; one that looked
// through the whole queue for those it may let in (wakeByScan) looks at
// n²/2 waiters.
func TestDrainOfOneProcessThreads(t *testing.T) {
	const n = 300
	for _, mode := range []string{"fixed", "control-wake-all", "control-scan"} {
		t.Run(mode, func(t *testing.T) {
			if mode != "fixed" {
				defer func(old bool) { wakeByScan = old }(wakeByScan)
				wakeByScan = true
			}
			if mode == "control-wake-all" {
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
					queued = ls.queueLenLocked()
				}
				e.mu.Unlock()
				if queued == n {
					break
				}
				time.Sleep(time.Millisecond)
			}
			e.mu.Lock()
			before, examinedBefore := e.wakes, e.examined
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
			wakes, examined := e.wakes-before, e.examined-examinedBefore
			e.mu.Unlock()
			t.Logf("%d wake-ups, %d waiters looked at, to drain %d threads of one process", wakes, examined, n)
			bound := uint64(4 * n)
			switch {
			case mode == "fixed" && (wakes > bound || examined > bound):
				t.Errorf("%d wake-ups and %d waiters looked at to drain %d waiters, want at most %d each", wakes, examined, n, bound)
			case mode == "control-wake-all" && wakes <= bound:
				t.Errorf("control: waking every thread of the holder's process took only %d wake-ups: the test cannot tell", wakes)
			case mode == "control-scan" && examined <= bound:
				t.Errorf("control: scanning the queue at each grant looked at only %d waiters: the test cannot tell", examined)
			}
		})
	}
}
