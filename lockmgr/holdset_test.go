package lockmgr

import (
	"sort"
	"testing"
)

// TestHoldSet: a set of holds behaves as the map it replaces, through
// the switch from one inline hold to a map and back, and with holds
// deleted while it is walked (control: a walk without deletions sees every
// hold).
func TestHoldSet(t *testing.T) {
	var s holdSet
	ids := func() []uint64 {
		var out []uint64
		for o, h := range s.all() {
			if h.owner != o {
				t.Fatalf("hold of %v yielded as %v's", h.owner, o)
			}
			out = append(out, o.ID)
		}
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out
	}
	h := func(id uint64) *hold { return &hold{owner: Owner{OwnerFile, id}} }
	if s.len() != 0 || s.get(Owner{OwnerFile, 1}) != nil || len(ids()) != 0 {
		t.Fatal("an empty set has a hold")
	}
	a, a2, b, c := h(1), h(1), h(2), h(3)
	s.put(a)
	s.put(a2) // replaces a, stays inline
	if s.more != nil || s.get(a.owner) != a2 || s.len() != 1 {
		t.Fatalf("after two puts of one owner: inline %v, map %v", s.one, s.more)
	}
	s.put(b)
	s.put(c)
	if s.one != nil || s.len() != 3 || s.get(b.owner) != b || s.get(Owner{OwnerPOSIX, 2}) != nil {
		t.Fatalf("three owners: inline %v, map %v", s.one, s.more)
	}
	if got := ids(); len(got) != 3 || got[0] != 1 || got[2] != 3 {
		t.Fatalf("control: the walk yields %v, want [1 2 3]", got)
	}
	for o := range s.all() {
		if o.ID != 2 {
			s.del(o)
		}
	}
	if got := ids(); len(got) != 1 || got[0] != 2 || s.get(a.owner) != nil {
		t.Fatalf("after deleting all but 2 in a walk: %v", got)
	}
	s.del(b.owner)
	if s.len() != 0 || s.more != nil || s.one != nil {
		t.Fatalf("emptied: inline %v, map %v", s.one, s.more)
	}
	s.put(c)
	s.del(a.owner) // not there
	if s.get(c.owner) != c || s.more != nil {
		t.Fatalf("one hold again: inline %v, map %v", s.one, s.more)
	}
}
