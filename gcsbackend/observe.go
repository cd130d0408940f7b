package gcsbackend

import (
	"strings"
	"sync"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
)

// Expiry by observation.
//
// A host never learns how old another host's claim is from a timestamp:
// clocks of different hosts may be offset arbitrarily. Instead every read
// of a lock object is an observation, taken on this host's monotonic clock
// when the answer arrived: for each claim of another host, the first time
// its current Seq was seen. A claim is stale once this host has seen the
// same Seq for the claim's StaleMillis. The holder writes a new Seq with
// every refresh, and a write is seen only after it was sent, so by then
// the holder has stopped vouching for the Seq it wrote (see
// docs/GCS-PROTOCOL.md for the argument).
//
// Observations live as long as the backend, across Claim calls, so that
// repeated non-blocking attempts (flock -n in a loop) see an abandoned
// claim expire. A read prunes the claims that are gone from the object;
// objects not read for a long time are forgotten, which only makes the next
// observation start over.

// obsForget is how many multiples of an object's longest stale period its
// observations are kept without a read.
const obsForget = 4

// observations is the backend's memory of other hosts' claims.
type observations struct {
	mu sync.Mutex
	// objects maps an object name to what was seen of it. GUARDED_BY(mu)
	objects map[string]*objectObs
	// sweepAt is when the next sweep of forgotten objects is due. GUARDED_BY(mu)
	sweepAt time.Duration
}

type objectObs struct {
	claims  map[string]seen // by claim id
	lastRd  time.Duration   // last read
	keepFor time.Duration   // obsForget times the longest stale period seen
}

// seen is the first sighting of a claim's Seq.
type seen struct {
	seq   uint64
	first time.Duration
}

func newObservations() *observations {
	return &observations{objects: make(map[string]*objectObs)}
}

// observe records a read of name, answered at now, that showed rec (nil if
// the object does not exist). Claims for which own returns true are this
// backend's live claims and are not recorded.
func (o *observations) observe(name string, rec *record, now time.Duration, own func(claim string) bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sweepLocked(now)
	ob := o.objects[name]
	if rec == nil || len(rec.Holders) == 0 {
		delete(o.objects, name)
		return
	}
	if ob == nil {
		ob = &objectObs{claims: make(map[string]seen)}
		o.objects[name] = ob
	}
	ob.lastRd = now
	present := make(map[string]bool, len(rec.Holders))
	for _, e := range rec.Holders {
		if own(e.Claim) {
			continue
		}
		present[e.Claim] = true
		if s, ok := ob.claims[e.Claim]; !ok || s.seq != e.Seq {
			ob.claims[e.Claim] = seen{seq: e.Seq, first: now}
		}
		ob.keepFor = max(ob.keepFor, obsForget*e.staleAfter())
	}
	for c := range ob.claims {
		if !present[c] {
			delete(ob.claims, c)
		}
	}
}

// sweepLocked forgets objects not read for their keepFor.
func (o *observations) sweepLocked(now time.Duration) {
	if now < o.sweepAt {
		return
	}
	o.sweepAt = now + time.Minute
	for name, ob := range o.objects {
		if now-ob.lastRd > max(ob.keepFor, time.Minute) {
			delete(o.objects, name)
		}
	}
}

// staleAt returns when e, a claim in object name, becomes stale by this
// host's observations: the first sighting of its current Seq plus its
// stale period (or fallback, if the entry declares none). ok is false if
// this host has not seen e's current Seq.
func (o *observations) staleAt(name string, e *entry, fallback time.Duration) (at time.Duration, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ob := o.objects[name]
	if ob == nil {
		return 0, false
	}
	s, ok := ob.claims[e.Claim]
	if !ok || s.seq != e.Seq {
		return 0, false
	}
	d := e.staleAfter()
	if d <= 0 {
		d = fallback
	}
	return s.first + d, true
}

// verdict is what a would-be writer makes of the other claims in a record.
type verdict struct {
	// blockers are live claims of others that conflict with the mode asked.
	blockers []entry
	// removable are claims that may be removed now: stale claims of other
	// hosts, and claims of this backend's own session that no lease holds
	// (left by a claim whose caller gave up while its write was in flight).
	removable map[string]bool
	// nextStale is the earliest instant a blocker may become stale; 0 if
	// none is observed yet.
	nextStale time.Duration
}

// judge decides which claims in the object name (content rec) block a
// claim in mode by the claim self ("" for a new claim), and which may be
// removed.
func (b *Backend) judge(name string, rec *record, mode lockmgr.Mode, self string, now time.Duration) verdict {
	v := verdict{removable: make(map[string]bool)}
	if rec == nil {
		return v
	}
	for i := range rec.Holders {
		e := &rec.Holders[i]
		if e.Claim == self {
			continue
		}
		if b.ownSession(e.Claim) && !b.holdsClaim(e.Claim) {
			v.removable[e.Claim] = true
			continue
		}
		if at, ok := b.obs.staleAt(name, e, b.cfg.staleAfter()); ok && now >= at {
			v.removable[e.Claim] = true
			continue
		}
		if b.unsafeWallExpiry && b.wallNow().Sub(e.Refreshed) > time.Duration(e.TTLMillis)*time.Millisecond {
			// Test hook: the broken design the skew tests must catch.
			v.removable[e.Claim] = true
			continue
		}
		if !lockmgr.Conflicts(mode, e.mode()) {
			continue
		}
		v.blockers = append(v.blockers, *e)
		if at, ok := b.obs.staleAt(name, e, b.cfg.staleAfter()); ok && (v.nextStale == 0 || at < v.nextStale) {
			v.nextStale = at
		}
	}
	return v
}

// ownSession reports whether claim was made by this backend.
func (b *Backend) ownSession(claim string) bool {
	return strings.HasPrefix(claim, b.session+".")
}
