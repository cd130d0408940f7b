package control

import (
	"slices"
	"testing"

	"github.com/lockfs/lockfs/lockmgr"
)

// TestHandleOwnersFollowRecords: a handle lists exactly the owners whose
// record in its node names it, so that Release looks only at those: an
// owner that asks through another handle moves to it, one forgotten
// leaves.
func TestHandleOwnersFollowRecords(t *testing.T) {
	n := &controlNode{}
	h1, h2 := &controlHandle{n: n}, &controlHandle{n: n}
	o1 := lockmgr.Owner{Class: lockmgr.OwnerPOSIX, ID: 1}
	o2 := lockmgr.Owner{Class: lockmgr.OwnerPOSIX, ID: 2}
	id := lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}
	check := func(step string) {
		t.Helper()
		for _, h := range []*controlHandle{h1, h2} {
			var want []lockmgr.Owner
			n.owners.each(func(o lockmgr.Owner, rec ownerRecord) {
				if rec.h == h {
					want = append(want, o)
				}
			})
			got := slices.Clone(h.owners)
			slices.SortFunc(got, func(a, b lockmgr.Owner) int { return int(a.ID) - int(b.ID) })
			slices.SortFunc(want, func(a, b lockmgr.Owner) int { return int(a.ID) - int(b.ID) })
			if !slices.Equal(got, want) {
				t.Errorf("%s: handle lists %v, the node's records name it for %v", step, got, want)
			}
		}
	}
	n.remember(o1, h1, id)
	n.remember(o2, h1, id)
	n.remember(o1, h1, id) // again through the same handle
	check("two owners through h1")
	n.remember(o1, h2, id)
	check("o1 moved to h2")
	if _, ok := n.forget(o2); !ok {
		t.Fatal("o2 not found")
	}
	check("o2 forgotten")
	if len(h1.owners) != 0 || len(h2.owners) != 1 {
		t.Errorf("h1 lists %v, h2 %v; want none and o1", h1.owners, h2.owners)
	}
}
