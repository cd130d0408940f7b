package control

import (
	"slices"

	"github.com/lockfs/lockfs/lockmgr"
)

// ownerRecords maps owners to their ownerRecord (controlNode.owners). A
// control file is nearly always locked through by one owner at a time, so
// the first is kept inline and only the others in a map, made when a
// second owner comes: a map of one entry costs a whole group of eight
// slots (about 0.4 KiB), once per held lock (docs/BENCHMARKS.md "Held
// locks"). The zero value is empty. Not safe for concurrent use. A lock
// call records its owner before it asks the engine (controlNode.remember,
// lock.go); an unlock, a Flush and a Release take it out again
// (controlNode.forget, release.go).
type ownerRecords struct {
	first    ownerRecord
	firstOf  lockmgr.Owner
	hasFirst bool
	// rest holds the owners other than firstOf; nil when there are none.
	rest map[lockmgr.Owner]ownerRecord
}

// get returns o's record.
func (r *ownerRecords) get(o lockmgr.Owner) (ownerRecord, bool) {
	if r.hasFirst && r.firstOf == o {
		return r.first, true
	}
	rec, ok := r.rest[o]
	return rec, ok
}

// set records rec for o, replacing o's record if it has one.
func (r *ownerRecords) set(o lockmgr.Owner, rec ownerRecord) {
	switch _, inRest := r.rest[o]; {
	case r.hasFirst && r.firstOf == o:
		r.first = rec
	case inRest:
		r.rest[o] = rec
	case !r.hasFirst:
		r.first, r.firstOf, r.hasFirst = rec, o, true
	default:
		if r.rest == nil {
			r.rest = make(map[lockmgr.Owner]ownerRecord)
		}
		r.rest[o] = rec
	}
}

// remove drops o's record, if any.
func (r *ownerRecords) remove(o lockmgr.Owner) {
	if r.hasFirst && r.firstOf == o {
		r.first, r.firstOf, r.hasFirst = ownerRecord{}, lockmgr.Owner{}, false
		return
	}
	delete(r.rest, o)
	if len(r.rest) == 0 {
		r.rest = nil
	}
}

// len is the number of owners recorded.
func (r *ownerRecords) len() int {
	n := len(r.rest)
	if r.hasFirst {
		n++
	}
	return n
}

// each calls fn for every owner and its record, in no particular order.
// fn must not change r.
func (r *ownerRecords) each(fn func(lockmgr.Owner, ownerRecord)) {
	if r.hasFirst {
		fn(r.firstOf, r.first)
	}
	for o, rec := range r.rest {
		fn(o, rec)
	}
}

// dropOwnerLocked removes owner from h.owners. Called with h.n.mu held.
func (h *controlHandle) dropOwnerLocked(owner lockmgr.Owner) {
	if i := slices.Index(h.owners, owner); i >= 0 {
		h.owners = slices.Delete(h.owners, i, i+1)
	}
}
