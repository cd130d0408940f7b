package control

import (
	"math/rand"
	"testing"

	"github.com/lockfs/lockfs/lockmgr"
)

// TestOwnerRecordsLikeAMap runs random sets, removes and gets on
// ownerRecords and on a plain map side by side: they must agree on every
// answer, on len and on what each visits.
func TestOwnerRecordsLikeAMap(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	var r ownerRecords
	model := map[lockmgr.Owner]ownerRecord{}
	ids := []lockmgr.LockID{{Path: "a", Kind: lockmgr.KindDir}, {Path: "b", Kind: lockmgr.KindNewDir}}
	for i := 0; i < 20000; i++ {
		o := lockmgr.Owner{Class: lockmgr.OwnerFile, ID: uint64(rng.Intn(5))}
		switch rng.Intn(3) {
		case 0:
			rec := ownerRecord{id: ids[rng.Intn(len(ids))]}
			r.set(o, rec)
			model[o] = rec
		case 1:
			r.remove(o)
			delete(model, o)
		}
		got, ok := r.get(o)
		want, wok := model[o]
		if ok != wok || got != want {
			t.Fatalf("step %d: get(%v) = %v, %v; a map says %v, %v", i, o, got, ok, want, wok)
		}
		if r.len() != len(model) {
			t.Fatalf("step %d: len %d; a map has %d", i, r.len(), len(model))
		}
		seen := map[lockmgr.Owner]ownerRecord{}
		r.each(func(o lockmgr.Owner, rec ownerRecord) {
			if _, dup := seen[o]; dup {
				t.Fatalf("step %d: each visits %v twice", i, o)
			}
			seen[o] = rec
		})
		if len(seen) != len(model) {
			t.Fatalf("step %d: each visits %d owners; a map has %d", i, len(seen), len(model))
		}
		for o, rec := range model {
			if seen[o] != rec {
				t.Fatalf("step %d: each gives %v for %v; a map has %v", i, seen[o], o, rec)
			}
		}
	}
}
