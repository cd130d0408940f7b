package lockmgr

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
)

// tallyOf counts a Snapshot the way Tally counts the table, zeros left out.
func tallyOf(snap []LockStatus) Tally {
	t := Tally{Held: map[KindMode]int{}, Waiting: map[Kind]int{}}
	for _, st := range snap {
		for _, h := range st.Holders {
			if h.Explicit && h.Lost == nil {
				t.Held[KindMode{st.Lock.Kind, h.Mode}]++
			}
		}
		if len(st.Waiters) > 0 {
			t.Waiting[st.Lock.Kind] += len(st.Waiters)
		}
	}
	return t
}

// tallyDiff says how a and b differ, zero counts aside; "" if they do not.
func tallyDiff(a, b Tally) string {
	drop := func(t Tally) Tally {
		maps.DeleteFunc(t.Held, func(_ KindMode, n int) bool { return n == 0 })
		maps.DeleteFunc(t.Waiting, func(_ Kind, n int) bool { return n == 0 })
		return t
	}
	a, b = drop(a), drop(b)
	if maps.Equal(a.Held, b.Held) && maps.Equal(a.Waiting, b.Waiting) {
		return ""
	}
	return fmt.Sprintf("%+v != %+v", a, b)
}

// TestTallyMatchesSnapshot: Tally counts what Snapshot lists: explicit
// holds by kind and mode (implicit ones and lost ones not), waiters by
// kind. The control: a Snapshot with one more explicit holder differs.
func TestTallyMatchesSnapshot(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	for _, pid := range []int{100, 200, 300, 400} {
		tree.add(pid, 1)
	}
	e := newTestEngine(t, tree, host)
	t.Cleanup(func() { e.Close() })
	ctx := context.Background()
	x := LockID{Path: "x", Kind: KindDir}
	xc := LockID{Path: "x/c", Kind: KindDir}
	xd := LockID{Path: "x/d", Kind: KindDir}
	xn := LockID{Path: "x", Kind: KindNewDir}
	own := func(id uint64) Owner { return Owner{OwnerFile, id} }
	for _, r := range []Request{
		{Lock: xc, Mode: Exclusive, Owner: own(1), TID: 100, Wait: true},
		{Lock: xd, Mode: Shared, Owner: own(2), TID: 200, Wait: true},
		{Lock: xn, Mode: Shared, Owner: own(3), TID: 300, Wait: true},
	} {
		if _, err := e.Acquire(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// A waiter: x exclusive behind the holds inside x.
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := e.Acquire(waitCtx, Request{Lock: x, Mode: Exclusive, Owner: own(4), TID: 400, Wait: true})
		done <- err
	}()
	eventuallyLock(t, e, x, "400 queued on x", func(ls *lockState) bool { return ls != nil && ls.queueLenLocked() == 1 })
	// A lost hold: x/d's lease lost.
	leaseOf(e, xd).lose(errors.New("test: lease lost"))
	eventuallyLock(t, e, xd, "x/d's hold marked lost", func(ls *lockState) bool {
		h := ls.holds.get(own(2))
		return h != nil && h.lostErr() != nil
	})

	got, snap := e.Tally(), e.Snapshot()
	want := Tally{
		Held:    map[KindMode]int{{KindDir, Exclusive}: 1, {KindNewDir, Shared}: 1},
		Waiting: map[Kind]int{KindDir: 1},
	}
	if d := tallyDiff(got, want); d != "" {
		t.Errorf("Tally: %s", d)
	}
	if d := tallyDiff(got, tallyOf(snap)); d != "" {
		t.Errorf("Tally and Snapshot disagree: %s", d)
	}
	// The control: one more explicit holder in the snapshot is seen.
	snap[0].Holders = append(snap[0].Holders, Holder{Mode: Shared, Explicit: true})
	if tallyDiff(got, tallyOf(snap)) == "" {
		t.Error("control: a snapshot with one more explicit holder tallies the same")
	}
	cancel()
	if err := <-done; err == nil {
		t.Error("400's request was granted while x/c was held")
	}
}

// TestTallyCopiesNothing: a scrape's count of 1,000 held locks allocates
// a few maps, not a copy per lock. The control: Snapshot allocates at
// least one object per lock.
func TestTallyCopiesNothing(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	e := newTestEngine(t, tree, host)
	t.Cleanup(func() { e.Close() })
	const n = 1000
	for i := range n {
		r := Request{Lock: LockID{Path: fmt.Sprintf("d/%d", i), Kind: KindDir}, Mode: Exclusive,
			Owner: Owner{OwnerFile, uint64(i + 1)}, TID: 100, Wait: true}
		if _, err := e.Acquire(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.Tally().Held[KindMode{KindDir, Exclusive}]; got != n {
		t.Fatalf("Tally counts %d exclusive holds, want %d", got, n)
	}
	if a := testing.AllocsPerRun(5, func() { e.Tally() }); a > 20 {
		t.Errorf("Tally of %d held locks allocates %.0f objects, want a few maps", n, a)
	}
	if a := testing.AllocsPerRun(5, func() { e.Snapshot() }); a < n {
		t.Errorf("control: Snapshot of %d held locks allocates %.0f objects, fewer than one per lock", n, a)
	}
}
