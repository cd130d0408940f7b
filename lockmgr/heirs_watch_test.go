package lockmgr

import (
	"context"
	"testing"
	"time"
)

// wall is the clock's time as Config.Now.
func (c *fakeClock) wall() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Unix(1e9, 0).Add(c.now)
}

// waitWatches waits until pid has started want watches and waiting of
// them still wait.
func waitWatches(t *testing.T, tree *fakeTree, pid, want, waiting int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, w := tree.watchCounts(pid)
		if s == want && w == waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d: %d watches started, %d waiting; want %d and %d", pid, s, w, want, waiting)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestIdleWatchReused: a process that locks and unlocks ten times in a
// row is watched once (the watch outlives its last hold by watchLinger and
// is reused); the watch ends when its process exits while idle, and at
// the first lock request after watchLinger. Control: with linger 0 (a
// watch ends with its last hold, as before) the same loop starts ten
// watches.
func TestIdleWatchReused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		linger  time.Duration
		watches int
	}{
		{"linger", watchLinger, 1},
		{"control-no-linger", 0, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tree, host := newFakeTree(), newMemHost()
			for _, pid := range []int{100, 200, 300} {
				tree.add(pid, 1)
			}
			clock := newFakeClock()
			e, err := New(Config{Backend: &memBackend{host: host}, Processes: tree, Now: clock.wall})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			e.linger = tc.linger
			ctx := context.Background()
			id := LockID{Path: "d", Kind: KindDir}
			pair := func(tid int) {
				t.Helper()
				owner := Owner{OwnerFile, uint64(tid)}
				if _, err := e.Acquire(ctx, Request{Lock: id, Mode: Exclusive, Owner: owner, TID: tid, Wait: true}); err != nil {
					t.Fatal(err)
				}
				if err := e.Release(ctx, id, owner); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < 10; i++ {
				pair(100)
				clock.advance(watchLinger / 10) // reused within the linger
			}
			idle := 0
			if tc.linger > 0 {
				idle = 1
			}
			waitWatches(t, tree, 100, tc.watches, idle)
			if tc.linger == 0 {
				return
			}

			// An idle watch ends with its process.
			pair(300)
			waitWatches(t, tree, 300, 1, 1)
			tree.exit(300)
			waitWatches(t, tree, 300, 1, 0)
			e.mu.Lock()
			_, kept := e.watches[ProcID{PID: 300, Start: 1}]
			e.mu.Unlock()
			if kept {
				t.Error("the idle watch of an exited process is still in the table")
			}

			// ... and at the first request after watchLinger.
			clock.advance(watchLinger)
			pair(200)
			waitWatches(t, tree, 100, 1, 0)
			e.mu.Lock()
			_, kept = e.watches[ProcID{PID: 100, Start: 1}]
			queued := len(e.idle)
			e.mu.Unlock()
			if kept {
				t.Error("a watch idle for watchLinger is still in the table")
			}
			if queued != 1 { // 200's
				t.Errorf("%d idle watches queued, want 1", queued)
			}
		})
	}
}
