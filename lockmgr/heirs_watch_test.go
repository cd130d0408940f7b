package lockmgr

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
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

// TestHeirsScannedAgainAfterTransientDescriptor: shell 50 holds the open
// file description (exec 8>d/.lock) through which flock 100 took d. When
// 100 exits, a status reader (300, cat d/.lock) has a description of its
// own open, so the scan finds two candidates and names nobody. The reader
// closes; the scan made again after heirRescans[0] names the shell, and
// the shell's child 110 then runs under the lock (d/e granted at once).
// Before, the hold stayed nobody's until released. Control: with no
// rescans the child is refused (the same state as before the fix).
func TestHeirsScannedAgainAfterTransientDescriptor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rescans []time.Duration
		want    error
	}{
		{"rescan", heirRescans, nil},
		{"control-no-rescan", nil, ErrWouldBlock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			saved := heirRescans
			heirRescans = tc.rescans
			defer func() { heirRescans = saved }()
			tree, clock := newFakeTree(), newFakeClock()
			tree.add(50, 1)
			tree.add(100, 50)
			tree.add(110, 50)
			tree.add(300, 1)
			e, err := New(Config{Backend: &memBackend{host: newMemHost()}, Processes: tree, Now: clock.wall, After: clock.after})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			const ino = 7
			d := LockID{Path: "d", Kind: KindDir}
			shellDesc, readerDesc := fakeDesc{ino: ino, id: 1}, fakeDesc{ino: ino, id: 2}
			tree.open(50, shellDesc)
			tree.open(100, shellDesc)
			if _, err := e.Acquire(ctx, Request{Lock: d, Mode: Exclusive, Owner: Owner{OwnerFile, 1}, TID: 100, Wait: true, Ino: ino}); err != nil {
				t.Fatal(err)
			}
			tree.open(300, readerDesc)
			tree.exit(100)
			// The first scan has run once the hold is inherited by nobody:
			// Status names the taker, and the exit has been seen.
			holder := func() int {
				st := e.Status(d)
				if len(st.Holders) != 1 {
					t.Fatalf("status: %+v", st)
				}
				return st.Holders[0].Process.PID
			}
			testutil.Eventually(t, "the taker's exit to be handled", func() bool {
				e.mu.Lock()
				defer e.mu.Unlock()
				h := e.locks[d].holds.get(Owner{OwnerFile, 1})
				r := h.fateOf()
				return r.scanned && r.scanning == 0
			})
			if p := holder(); p != 100 {
				t.Fatalf("after the ambiguous scan the hold belongs to %d, want nobody (the taker 100 shown)", p)
			}
			tree.close(300, readerDesc)
			clock.advance(time.Second)
			if tc.want == nil {
				testutil.Eventually(t, "the shell to inherit the hold", func() bool { return holder() == 50 })
			}
			_, err = e.Acquire(ctx, Request{Lock: LockID{Path: "d/e", Kind: KindDir}, Mode: Exclusive, Owner: Owner{OwnerFile, 2}, TID: 110, Ino: ino + 1})
			if !errors.Is(err, tc.want) {
				t.Fatalf("the shell's child asking for d/e: %v, want %v", err, tc.want)
			}
		})
	}
}

// TestExitOfManyHoldsScansOnce: flock 100 takes 200 locks p/0 … p/199,
// each through a description its shell 50 shares (exec N>p/I/.lock), and
// exits. Every hold, and the shared holds on p that came with them, pass
// to the shell, after one scan of the processes' descriptors: before, the
// engine scanned once per lock, and gathered the other parties of p's 200
// holds once for each of them, which made the exit of a daemon's client
// holding 12,000 locks take 13 s to hand on. Control: scanning once per
// control file, as before (scanEach), makes 200 scans.
func TestExitOfManyHoldsScansOnce(t *testing.T) {
	const n = 200
	for _, tc := range []struct {
		name  string
		each  bool
		scans int
	}{
		{"one-scan", false, 1},
		{"control-scan-each", true, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.each {
				saved := scanDescriptors
				scanDescriptors = scanEach
				defer func() { scanDescriptors = saved }()
			}
			tree := newFakeTree()
			tree.add(50, 1)
			tree.add(100, 50)
			e, err := New(Config{Backend: &memBackend{host: newMemHost()}, Processes: tree})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			lock := func(i int) LockID { return LockID{Path: "p/" + strconv.Itoa(i), Kind: KindDir} }
			for i := 0; i < n; i++ {
				ino := uint64(1000 + i)
				d := fakeDesc{ino: ino, id: uint64(i)}
				tree.open(50, d)
				tree.open(100, d)
				if _, err := e.Acquire(ctx, Request{Lock: lock(i), Mode: Exclusive, Owner: Owner{OwnerFile, uint64(i + 1)}, TID: 100, Wait: true, Ino: ino}); err != nil {
					t.Fatal(err)
				}
			}
			tree.exit(100)
			testutil.Eventually(t, "every hold to pass to the shell", func() bool {
				for i := 0; i < n; i++ {
					st := e.Status(lock(i))
					if len(st.Holders) != 1 || st.Holders[0].Process.PID != 50 {
						return false
					}
				}
				return true
			})
			tree.mu.Lock()
			scans := tree.scans
			tree.mu.Unlock()
			if scans != tc.scans {
				t.Errorf("%d scans of the descriptors for the exit, want %d", scans, tc.scans)
			}
		})
	}
}

// scanEach asks w about one inode at a time, as findHeirsDropsMu did before
// one scan served them all.
func scanEach(ctx context.Context, w ProcessWatcher, inos []uint64, known func(ino uint64, pid int) bool) (map[uint64][][]ProcID, error) {
	found := map[uint64][][]ProcID{}
	for _, ino := range inos {
		one, err := w.Descriptors(ctx, []uint64{ino}, known)
		if err != nil {
			return found, err
		}
		found[ino] = one[ino]
	}
	return found, nil
}

// blockingScanTree is a fakeTree whose scans of descriptors block until
// their context ends or release is closed: a long /proc scan.
type blockingScanTree struct {
	*fakeTree
	started chan struct{} // closed when the first scan starts
	release chan struct{} // closing it lets every scan finish
	once    sync.Once
}

func (b *blockingScanTree) Descriptors(ctx context.Context, inos []uint64, known func(ino uint64, pid int) bool) (map[uint64][][]ProcID, error) {
	b.once.Do(func() { close(b.started) })
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.release:
	}
	return b.fakeTree.Descriptors(ctx, inos, known)
}

// TestCloseStopsScanForHeirs: Close does not wait for a scan for heirs
// that is under way (a holder died with 10,000 descriptors of its
// control file open: the scan took minutes, and `lockfs unmount` left the
// daemon running meanwhile); it cancels it. Control: a scan that does not
// get the engine's context (as before) holds Close until it ends.
func TestCloseStopsScanForHeirs(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "cancelled", true: "control-uncancelled"}[control], func(t *testing.T) {
			if control {
				saved := scanDescriptors
				scanDescriptors = func(_ context.Context, w ProcessWatcher, inos []uint64, known func(ino uint64, pid int) bool) (map[uint64][][]ProcID, error) {
					return w.Descriptors(context.Background(), inos, known)
				}
				defer func() { scanDescriptors = saved }()
			}
			tree := &blockingScanTree{fakeTree: newFakeTree(), started: make(chan struct{}), release: make(chan struct{})}
			tree.add(50, 1)
			tree.add(100, 50)
			const ino = 7
			d := fakeDesc{ino: ino, id: 1}
			tree.open(50, d)
			tree.open(100, d)
			e, err := New(Config{Backend: &memBackend{host: newMemHost()}, Processes: tree})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.Acquire(context.Background(), Request{Lock: LockID{Path: "d", Kind: KindDir}, Mode: Exclusive, Owner: Owner{OwnerFile, 1}, TID: 100, Ino: ino}); err != nil {
				t.Fatal(err)
			}
			tree.exit(100)
			select {
			case <-tree.started:
			case <-time.After(testutil.DefaultWait):
				t.Fatal("no scan for heirs after the holder exited")
			}
			closed := make(chan error, 1)
			go func() { closed <- e.Close() }()
			if control {
				select {
				case err := <-closed:
					t.Fatalf("control: Close returned (%v) while the uncancelled scan ran: the test cannot tell", err)
				case <-time.After(300 * time.Millisecond):
				}
				close(tree.release)
			}
			select {
			case err := <-closed:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(testutil.DefaultWait):
				close(tree.release)
				<-closed
				t.Fatal("Close waited for the scan for heirs")
			}
		})
	}
}

// TestHeirOfManyDescriptions: the holder 100 opened its control file five
// times and took the lock through one description; its child 150 holds
// all five when 100 exits. Whichever description is the hold's, 150 holds
// it: 150 is the heir. Before, five candidate descriptions named nobody,
// and the lock stayed nobody's until the last descriptor closed. Control:
// when another process (160) shares one of them, the candidates differ
// and nobody is named.
func TestHeirOfManyDescriptions(t *testing.T) {
	for _, other := range []bool{false, true} {
		t.Run(map[bool]string{false: "same-holders", true: "control-different-holders"}[other], func(t *testing.T) {
			tree := newFakeTree()
			tree.add(50, 1)
			tree.add(100, 50)
			tree.add(150, 100)
			tree.add(160, 50)
			const ino = 9
			for id := uint64(1); id <= 5; id++ {
				tree.open(100, fakeDesc{ino: ino, id: id})
				tree.open(150, fakeDesc{ino: ino, id: id})
			}
			if other {
				tree.open(160, fakeDesc{ino: ino, id: 5})
			}
			e, err := New(Config{Backend: &memBackend{host: newMemHost()}, Processes: tree})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			id := LockID{Path: "d", Kind: KindDir}
			if _, err := e.Acquire(context.Background(), Request{Lock: id, Mode: Exclusive, Owner: Owner{OwnerFile, 1}, TID: 100, Ino: ino}); err != nil {
				t.Fatal(err)
			}
			tree.exit(100)
			holder := func() int {
				st := e.Status(id)
				if len(st.Holders) != 1 {
					return -1
				}
				return st.Holders[0].Process.PID
			}
			if !other {
				testutil.Eventually(t, "the child to inherit the hold", func() bool { return holder() == 150 })
				return
			}
			testutil.Eventually(t, "the exit to be handled", func() bool {
				tree.mu.Lock()
				scans := tree.scans
				tree.mu.Unlock()
				e.mu.Lock()
				defer e.mu.Unlock()
				return scans > 0 && e.exitWork == 0
			})
			if h := holder(); h == 150 || h == 160 {
				t.Errorf("holder %d, want nobody named while two sets of processes hold descriptions", h)
			}
		})
	}
}
