package lockmgr

import (
	"context"
	"testing"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestHoldSize keeps a hold in the 96-byte size class: a host has one
// per held lock and one more on each of its ancestors for the lock's owner
// (docs/BENCHMARKS.md "Held locks"). A field added to hold must find room
// in its padding, go to holdRare (an explicit grant's) or holdFate (an
// exit's, a loss's, an adoption's), or say in BENCHMARKS what it costs.
func TestHoldSize(t *testing.T) {
	testutil.SizeAtMost[hold](t, 96)
	testutil.SizeAtMost[holdRare](t, 48)
	testutil.SizeAtMost[holdFate](t, 80)
}

// TestLockStateSize: a lock's table entry (one per held lock) stays in
// the 160-byte size class.
func TestLockStateSize(t *testing.T) {
	testutil.SizeAtMost[lockState](t, 160)
}

// TestImplicitHoldsHaveNoRare: a lock's implicit-only holds on its
// ancestors carry no holdRare (what makes them small), while its explicit
// hold has one (its grant number) — the control, which shows the look
// below can tell. Status shows the implicit holds as before, and the
// release leaves nothing in the table.
func TestImplicitHoldsHaveNoRare(t *testing.T) {
	tree, host := newFakeTree(), newMemHost()
	tree.add(100, 1)
	e := newTestEngine(t, tree, host)
	defer func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	}()
	ctx := context.Background()
	owner := Owner{OwnerFile, 7}
	if _, err := e.Acquire(ctx, Request{Lock: dirLock("a/b/c"), Mode: Exclusive, Owner: owner, TID: 100, Ino: 9}); err != nil {
		t.Fatal(err)
	}
	rareOf := func(p string) *holdRare {
		e.mu.Lock()
		defer e.mu.Unlock()
		ls := e.locks[dirLock(p)]
		if ls == nil {
			t.Fatalf("no lock %q in the table", p)
		}
		h := ls.holds.get(owner)
		if h == nil {
			t.Fatalf("no hold of %v on %q", owner, p)
		}
		if h.lockID() != dirLock(p) {
			t.Fatalf("hold on %q says it is on %v", p, h.lockID())
		}
		return h.rare
	}
	for _, p := range []string{".", "a", "a/b"} {
		if r := rareOf(p); r != nil {
			t.Errorf("implicit hold on %q has rare fields %+v", p, *r)
		}
	}
	if rareOf("a/b/c") == nil {
		t.Fatal("control: the explicit hold on a/b/c has no rare fields (its grant number)")
	}
	if f := rareOf("a/b/c").fate; f != nil {
		t.Errorf("a plain grant made the rarest fields too: %+v", *f)
	}
	for _, p := range []string{".", "a", "a/b"} {
		st := e.Status(dirLock(p))
		if len(st.Holders) != 1 || st.Holders[0].Explicit || st.Holders[0].Owner != owner || st.Holders[0].Token != 0 || st.Holders[0].Lost != nil {
			t.Errorf("status of %q: %+v, want one implicit hold of %v", p, st.Holders, owner)
		}
	}
	if err := e.Release(ctx, dirLock("a/b/c"), owner); err != nil {
		t.Fatal(err)
	}
	if n := tableLen(e); n != 0 {
		t.Errorf("%d locks left in the table after the release", n)
	}
}
