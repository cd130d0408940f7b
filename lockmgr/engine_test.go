package lockmgr

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

func newTestEngine(t testing.TB, tree *fakeTree, host *memHost) *Engine {
	t.Helper()
	e, err := New(Config{Backend: &memBackend{host: host}, Processes: tree})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestCloseLeavesNothing: Close wakes every waiter with ErrClosed, releases
// every lease, and stops every goroutine the engine started (the lease
// watchers among them).
func TestCloseLeavesNothing(t *testing.T) {
	testutil.CheckGoroutines(t)
	base := runtime.NumGoroutine()
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	tree.add(200, 1)
	e := newTestEngine(t, tree, host)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		if _, err := e.Acquire(ctx, Request{Lock: LockID{Path: fmt.Sprintf("d%d/x", i), Kind: KindDir}, Mode: Exclusive,
			Owner: Owner{OwnerFile, 1}, TID: 100, Wait: true}); err != nil {
			t.Fatal(err)
		}
	}
	errc := make(chan error, 1)
	go func() {
		_, err := e.Acquire(ctx, Request{Lock: LockID{Path: "d0/x", Kind: KindDir}, Mode: Shared,
			Owner: Owner{OwnerFile, 2}, TID: 200, Wait: true})
		errc <- err
	}()
	for {
		if len(e.Status(LockID{Path: "d0/x", Kind: KindDir}).Waiters) == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if runtime.NumGoroutine() <= base {
		t.Fatal("control: the lease watchers and the waiter should be running")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("waiter: %v, want ErrClosed", err)
	}
	host.mu.Lock()
	for id, l := range host.locks {
		if len(l) != 0 {
			t.Errorf("lease on %s still held after Close", id)
		}
	}
	host.mu.Unlock()
	if _, err := e.Acquire(ctx, Request{Lock: LockID{Path: "z", Kind: KindDir}, Mode: Shared,
		Owner: Owner{OwnerFile, 3}, TID: 100}); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire after Close: %v, want ErrClosed", err)
	}
}

// TestCancelLeavesNoTrace: a wait abandoned at any point leaves no hold,
// no waiter and no lease behind, including the implicit ancestor holds it
// had already taken.
func TestCancelLeavesNoTrace(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	tree.add(200, 1)
	e := newTestEngine(t, tree, host)
	defer e.Close()
	ctx := context.Background()
	if _, err := e.Acquire(ctx, Request{Lock: LockID{Path: "a/b", Kind: KindDir}, Mode: Exclusive,
		Owner: Owner{OwnerFile, 1}, TID: 100}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		cctx, cancel := context.WithTimeout(ctx, time.Duration(i%20)*50*time.Microsecond)
		_, err := e.Acquire(cctx, Request{Lock: LockID{Path: "a/b/c/d", Kind: KindDir}, Mode: Shared,
			Owner: Owner{OwnerFile, 2}, TID: 200, Wait: true})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("round %d: %v, want deadline exceeded", i, err)
		}
	}
	for _, st := range e.Snapshot() {
		for _, h := range st.Holders {
			if h.Owner.ID == 2 {
				t.Fatalf("%s: cancelled owner still holds: %+v", st.Lock, h)
			}
		}
		if len(st.Waiters) != 0 {
			t.Fatalf("%s: waiters left: %+v", st.Lock, st.Waiters)
		}
	}
	if err := e.Release(ctx, LockID{Path: "a/b", Kind: KindDir}, Owner{OwnerFile, 1}); err != nil {
		t.Fatal(err)
	}
	if n := tableLen(e); n != 0 {
		t.Fatalf("%d table entries left", n)
	}
}

// TestOnLoss: a lost lease is reported once per hold through OnLoss.
func TestOnLoss(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	var mu sync.Mutex
	var lost []LostHold
	e, err := New(Config{Backend: &memBackend{host: host}, Processes: tree, OnLoss: func(l LostHold) {
		mu.Lock()
		lost = append(lost, l)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := LockID{Path: "a", Kind: KindDir}
	if _, err := e.Acquire(context.Background(), Request{Lock: id, Mode: Exclusive, Owner: Owner{OwnerFile, 1}, TID: 100}); err != nil {
		t.Fatal(err)
	}
	leaseOf(e, id).lose(errors.New("gone"))
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(lost)
		mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("OnLoss called %d times, want 1", n)
		}
		time.Sleep(time.Millisecond)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if lost[0].Lock != id || lost[0].Holder.Process.PID != 100 || !errors.Is(lost[0].Err, ErrLeaseLost) ||
		!strings.Contains(lost[0].Err.Error(), "gone") {
		t.Fatalf("OnLoss got %+v", lost[0])
	}
}

// TestQuery: F_GETLK names the conflicting holder, also for an ancestor.
func TestQuery(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	tree.add(101, 100)
	tree.add(200, 1)
	e := newTestEngine(t, tree, host)
	defer e.Close()
	if _, err := e.Acquire(context.Background(), Request{Lock: LockID{Path: "a", Kind: KindDir}, Mode: Exclusive,
		Owner: Owner{OwnerPOSIX, 1}, TID: 100}); err != nil {
		t.Fatal(err)
	}
	h, ok := e.Query(Request{Lock: LockID{Path: "a/b", Kind: KindDir}, Mode: Shared, Owner: Owner{OwnerPOSIX, 2}, TID: 200})
	if !ok || h.Process.PID != 100 || h.Mode != Exclusive {
		t.Fatalf("query by a stranger: %+v %v, want the holder 100", h, ok)
	}
	if h, ok := e.Query(Request{Lock: LockID{Path: "a/b", Kind: KindDir}, Mode: Shared, Owner: Owner{OwnerPOSIX, 3}, TID: 101}); ok {
		t.Fatalf("query by the holder's child: %+v, want no conflict", h)
	}
	if h, ok := e.Query(Request{Lock: LockID{Path: "b", Kind: KindDir}, Mode: Exclusive, Owner: Owner{OwnerPOSIX, 2}, TID: 200}); ok {
		t.Fatalf("query on another lock: %+v, want no conflict", h)
	}
}

type countingObserver struct {
	mu       sync.Mutex
	outcomes map[Outcome]int
	lost     int
	yields   int
}

func (o *countingObserver) Requested(req Request, g Grant, outcome Outcome, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outcomes[outcome]++
}

func (o *countingObserver) Lost(id LockID, broken bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lost++
}

func (o *countingObserver) Yielded(id LockID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.yields++
}

// TestObserver: every request is reported with its outcome.
func TestObserver(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	tree.add(200, 1)
	obs := &countingObserver{outcomes: map[Outcome]int{}}
	e, err := New(Config{Backend: &memBackend{host: host}, Processes: tree, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	a := LockID{Path: "a", Kind: KindDir}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err = e.Acquire(ctx, Request{Lock: a, Mode: Exclusive, Owner: Owner{OwnerFile, 1}, TID: 100})
	must(err)
	_, err = e.Acquire(ctx, Request{Lock: a, Mode: Shared, Owner: Owner{OwnerFile, 2}, TID: 200})
	if !errors.Is(err, ErrWouldBlock) {
		t.Fatal(err)
	}
	_, err = e.Acquire(ctx, Request{Lock: a, Mode: Shared, Owner: Owner{OwnerFile, 3}, TID: 100, Wait: true})
	if !errors.Is(err, ErrDeadlock) {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	_, err = e.Acquire(cctx, Request{Lock: a, Mode: Shared, Owner: Owner{OwnerFile, 2}, TID: 200, Wait: true})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	// A malformed request (shared on a usage lock, EINVAL) is counted too.
	_, err = e.Acquire(ctx, Request{Lock: LockID{Path: "a", Kind: KindUsage}, Mode: Shared, Owner: Owner{OwnerFile, 4}, TID: 200})
	if !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	must(e.Break(ctx, a))
	obs.mu.Lock()
	defer obs.mu.Unlock()
	want := map[Outcome]int{Granted: 1, Conflict: 1, Deadlock: 1, Interrupted: 1, Failed: 1}
	for o, n := range want {
		if obs.outcomes[o] != n {
			t.Errorf("%s: %d, want %d (all: %v)", o, obs.outcomes[o], n, obs.outcomes)
		}
	}
	if obs.lost != 1 {
		t.Errorf("lost: %d, want 1", obs.lost)
	}
}

// TestLossOfAncestorLease: losing the lease of an ancestor (which the
// holder holds only implicitly) loses the holder's lock below, reported
// once, and leaves its other holds marked too; the control is an owner of
// an unrelated lock, which is not touched.
func TestLossOfAncestorLease(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	tree.add(200, 1)
	lost := make(chan LostHold, 16)
	e, err := New(Config{Backend: &memBackend{host: host}, Processes: tree, OnLoss: func(l LostHold) { lost <- l }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	ab := LockID{Path: "a/b", Kind: KindDir}
	if _, err := e.Acquire(ctx, Request{Lock: ab, Mode: Exclusive, Owner: Owner{OwnerFile, 1}, TID: 100}); err != nil {
		t.Fatal(err)
	}
	x := LockID{Path: "x", Kind: KindDir}
	if _, err := e.Acquire(ctx, Request{Lock: x, Mode: Exclusive, Owner: Owner{OwnerFile, 2}, TID: 200}); err != nil {
		t.Fatal(err)
	}
	leaseOf(e, LockID{Path: "a", Kind: KindDir}).lose(errors.New("gone"))
	select {
	case l := <-lost:
		if l.Lock != ab || l.Holder.Owner != (Owner{OwnerFile, 1}) {
			t.Fatalf("OnLoss: %+v, want the explicit hold on a/b", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnLoss not called")
	}
	select {
	case l := <-lost:
		t.Fatalf("OnLoss called again: %+v", l)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := e.Acquire(ctx, Request{Lock: ab, Mode: Shared, Owner: Owner{OwnerFile, 1}, TID: 100}); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("lock call on the lost lock: %v, want ErrLeaseLost", err)
	}
	if st := e.Status(x); len(st.Holders) != 1 || st.Holders[0].Lost != nil {
		t.Fatalf("control: the unrelated lock was touched: %+v", st)
	}
	if err := e.Release(ctx, ab, Owner{OwnerFile, 1}); err != nil {
		t.Fatalf("release of a lost lock: %v", err)
	}
}

// TestNoGrantOnSettlingLease: a hold is never granted on a lease whose
// downgrade is in flight. The lease still reports its old mode during the
// backend call; granting an exclusive hold on it then left that hold
// under a shared lease once the call returned (TestModel once saw "held
// exclusive but lease" with mode shared). Here process 100 holds x
// exclusive and downgrades its hold to shared; while the backend's
// downgrade is held at the gate, its child 101 asks for x exclusive: it
// must get it only with an exclusive lease. Before the fix the child was
// granted at once on the settling lease and the lease ended shared.
func TestNoGrantOnSettlingLease(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	tree.add(101, 100)
	e := newTestEngine(t, tree, host)
	t.Cleanup(func() { e.Close() })
	ctx := context.Background()
	x := LockID{Path: "x", Kind: KindDir}
	if _, err := e.Acquire(ctx, Request{Lock: x, Mode: Exclusive, Owner: Owner{OwnerFile, 1}, TID: 100, Wait: true}); err != nil {
		t.Fatal(err)
	}
	gate, down := acquireAtGate(t, e, host, &host.downgradeGate,
		Request{Lock: x, Mode: Shared, Owner: Owner{OwnerFile, 1}, TID: 100, Wait: true})
	child := make(chan error, 1)
	go func() {
		_, err := e.Acquire(ctx, Request{Lock: x, Mode: Exclusive, Owner: Owner{OwnerFile, 2}, TID: 101, Wait: true})
		child <- err
	}()
	// Give the child's request time to reach the lock, then let the
	// downgrade finish.
	time.Sleep(100 * time.Millisecond)
	close(gate)
	if err := <-down; err != nil {
		t.Fatal(err)
	}
	if err := <-child; err != nil {
		t.Fatalf("the child's exclusive request: %v", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	ls := e.locks[x]
	if need := ls.heldModeLocked(); ls.lease == nil || ls.lease.Mode() < need {
		t.Fatalf("x held %s but its lease is %v", need, ls.lease)
	}
}

// TestNoStrongerLeaseWhileItsRequesterWaits: a lease upgraded for a
// request that then cannot be granted is brought back down to what the
// holds need while that request waits. Process 100 holds x/c exclusive
// (so x shared) and asks for x exclusive: the lease's upgrade is held at
// the gate; meanwhile process 200 is granted x shared on the lease, still
// shared. Once the upgrade lands, 100's request conflicts with 200's hold
// and waits. Its exclusive lease kept other hosts out of x and all below
// it for as long as 200 held x: on GCS, with 200 waiting in turn for
// another host that waited for x, three hosts waited out their deadlines
// in TestPorcupineHierarchyFourHosts. The lease must go back to shared;
// without the settle before the wait it stays exclusive.
func TestNoStrongerLeaseWhileItsRequesterWaits(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	tree.add(200, 1)
	e := newTestEngine(t, tree, host)
	t.Cleanup(func() { e.Close() })
	ctx := context.Background()
	x := LockID{Path: "x", Kind: KindDir}
	xc := LockID{Path: "x/c", Kind: KindDir}
	p, r := Owner{OwnerFile, 1}, Owner{OwnerFile, 2}
	if _, err := e.Acquire(ctx, Request{Lock: xc, Mode: Exclusive, Owner: p, TID: 100, Wait: true}); err != nil {
		t.Fatal(err)
	}
	gate, up := acquireAtGate(t, e, host, &host.upgradeGate,
		Request{Lock: x, Mode: Exclusive, Owner: p, TID: 100, Wait: true})
	if _, err := e.Acquire(ctx, Request{Lock: x, Mode: Shared, Owner: r, TID: 200, Wait: true}); err != nil {
		t.Fatal(err)
	}
	close(gate)
	eventuallyLock(t, e, x, "100's request queued behind 200's hold", func(ls *lockState) bool {
		return ls != nil && ls.head != nil && ls.head.rc.req.TID == 100
	})
	eventuallyLock(t, e, x, "x's lease back to shared while 100 waits", func(ls *lockState) bool {
		return ls.lease != nil && !ls.busy && ls.lease.Mode() == Shared
	})
	// Status shows the request once, queued: it waited outside (for
	// the upgrade) first. Before, it stayed in the outside set too and
	// showed twice, once as waiting for the backend.
	var mine []Waiter
	for _, w := range e.Status(x).Waiters {
		if w.Owner == p {
			mine = append(mine, w)
		}
	}
	if len(mine) != 1 || mine[0].Outside {
		t.Errorf("status shows 100's waiting request as %+v, want it once, queued", mine)
	}
	if err := e.Release(ctx, x, r); err != nil {
		t.Fatal(err)
	}
	if err := <-up; err != nil {
		t.Fatalf("100's exclusive request after 200's release: %v", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if ls := e.locks[x]; ls.lease == nil || ls.lease.Mode() != Exclusive {
		t.Fatalf("x granted exclusive on lease %v", ls.lease)
	}
}

// acquireAtGate sets one of host's gates (downgradeGate, upgradeGate),
// starts req and waits until its backend call is in flight (the lock's
// lease busy). It returns the gate, to be closed, and req's outcome.
func acquireAtGate(t *testing.T, e *Engine, host *memHost, field *chan struct{}, req Request) (chan struct{}, <-chan error) {
	t.Helper()
	gate := make(chan struct{})
	host.mu.Lock()
	*field = gate
	host.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := e.Acquire(context.Background(), req)
		done <- err
	}()
	eventuallyLock(t, e, req.Lock, "the backend call in flight", func(ls *lockState) bool {
		return ls != nil && ls.busy
	})
	return gate, done
}

// eventuallyLock waits until cond holds for id's table entry (nil while
// there is none), read under mu.
func eventuallyLock(t *testing.T, e *Engine, id LockID, what string, cond func(ls *lockState) bool) {
	t.Helper()
	testutil.Eventually(t, what, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return cond(e.locks[id])
	})
}

// TestSnapshotWaitedOnlyWaitedFor: SnapshotWaited shows the locks that
// have waiters, with their holders and waiters as Snapshot shows them, and
// no lock that is only held (control: Snapshot shows those too).
func TestSnapshotWaitedOnlyWaitedFor(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	tree.add(200, 1)
	e := newTestEngine(t, tree, host)
	defer e.Close()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if _, err := e.Acquire(ctx, Request{Lock: LockID{Path: fmt.Sprintf("d%d/x", i), Kind: KindDir}, Mode: Exclusive,
			Owner: Owner{OwnerFile, 1}, TID: 100}); err != nil {
			t.Fatal(err)
		}
	}
	waited := LockID{Path: "d0/x", Kind: KindDir}
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := e.Acquire(wctx, Request{Lock: waited, Mode: Shared, Owner: Owner{OwnerFile, 2}, TID: 200, Wait: true})
		errc <- err
	}()
	waitQueued(t, e, waited, 1)
	all, got := e.Snapshot(), e.SnapshotWaited()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter: %v, want canceled", err)
	}
	if len(all) < 4 { // d0/x, d1/x, d2/x and their ancestors
		t.Errorf("control: Snapshot shows %d locks, want the 3 held and their ancestors", len(all))
	}
	if len(got) != 1 || got[0].Lock != waited {
		t.Fatalf("SnapshotWaited = %+v, want %s alone", got, waited)
	}
	for _, st := range all {
		if st.Lock == waited && !reflect.DeepEqual(st, got[0]) {
			t.Errorf("SnapshotWaited shows %+v, Snapshot %+v", got[0], st)
		}
	}
	if got := e.SnapshotWaited(); len(got) != 0 {
		t.Errorf("after the wait ended, SnapshotWaited = %+v, want none", got)
	}
}
