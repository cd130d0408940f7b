package lockmgr

import "iter"

// holdSet is a lock's holds, one per owner. Most locks have one holder
// (every held lock below the top has its own entry), so the first hold is
// kept inline and a map is made only for a second owner: a map of one
// costs 256 bytes (its header and a group of eight slots), a quarter KiB
// per held lock (docs/BENCHMARKS.md "Held locks").
//
// INVARIANT: more == nil, and one is the only hold or nil; or more != nil
// holds them all, and one is nil.
type holdSet struct {
	one  *hold
	more map[Owner]*hold
}

// get returns o's hold, nil if none.
func (s *holdSet) get(o Owner) *hold {
	if s.more != nil {
		return s.more[o]
	}
	if s.one != nil && s.one.owner == o {
		return s.one
	}
	return nil
}

// put adds or replaces h.owner's hold.
func (s *holdSet) put(h *hold) {
	switch {
	case s.more != nil:
		s.more[h.owner] = h
	case s.one == nil || s.one.owner == h.owner:
		s.one = h
	default:
		s.more = map[Owner]*hold{s.one.owner: s.one, h.owner: h}
		s.one = nil
	}
}

// del removes o's hold, if any.
func (s *holdSet) del(o Owner) {
	if s.more == nil {
		if s.one != nil && s.one.owner == o {
			s.one = nil
		}
		return
	}
	delete(s.more, o)
	if len(s.more) == 0 {
		s.more = nil
	}
}

// len returns the number of holds.
func (s *holdSet) len() int {
	if s.more != nil {
		return len(s.more)
	}
	if s.one != nil {
		return 1
	}
	return 0
}

// all yields every hold, in no particular order. Like a map's range, it
// may be used to delete or change the holds it yields; a hold put
// meanwhile may or may not be yielded.
func (s *holdSet) all() iter.Seq2[Owner, *hold] {
	return func(yield func(Owner, *hold) bool) {
		if s.more == nil {
			if h := s.one; h != nil {
				yield(h.owner, h)
			}
			return
		}
		for o, h := range s.more {
			if !yield(o, h) {
				return
			}
		}
	}
}
