package gcsbackend

import (
	"context"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// Expiry by observation.
//
// A host never learns how old another host's heartbeat is from a
// timestamp: clocks of different hosts may be offset arbitrarily. Instead
// every read of a session object is an observation, taken on this host's
// monotonic clock when the answer arrived: the first time its current
// generation was seen. A session is stale once this host has seen the same
// generation for the session's stale period (its holder's TTL). The holder
// writes a new generation with every heartbeat, and a write is seen only
// after it was sent, so by then the holder has stopped vouching for the
// heartbeat it wrote (see docs/GCS-PROTOCOL.md for the argument).
//
// A stale session is declared dead by a write conditional on the
// generation judged, so that it cannot be revived by a heartbeat in
// flight. Dead and missing sessions are remembered for good: session ids
// never come back.
//
// Observations live as long as the backend, across Claim calls, so that
// repeated non-blocking attempts (flock -n in a loop) see a crashed
// holder's session expire.

// observations is the backend's memory of other hosts' sessions.
type observations struct {
	mu sync.Mutex
	// seen maps a session id to its first sighting. GUARDED_BY(mu)
	seen map[string]sighting
	// dead holds the sessions known dead or missing (and this backend's own
	// lost ones). GUARDED_BY(mu)
	dead map[string]bool
}

// sighting is the first read that showed a session's current generation.
type sighting struct {
	gen   int64
	first time.Duration
	stale time.Duration
}

func newObservations() *observations {
	return &observations{seen: make(map[string]sighting), dead: make(map[string]bool)}
}

// markDead remembers that session id is dead.
func (b *Backend) markDead(id string) {
	b.obs.mu.Lock()
	b.obs.dead[id] = true
	delete(b.obs.seen, id)
	b.obs.mu.Unlock()
}

// isDead reports whether session id is known dead or missing.
func (b *Backend) isDead(id string) bool {
	b.obs.mu.Lock()
	defer b.obs.mu.Unlock()
	return b.obs.dead[id]
}

// judgement is what a host makes of another host's session.
type judgement struct {
	dead bool
	// staleAt is when it turns stale if its generation stays, on this
	// host's clock; 0 if unknown.
	staleAt time.Duration
}

// judgeSession reads session id's object and says whether it is dead: gone,
// declared dead, or seen unchanged for its stale period, in which case this
// host declares it dead (one conditional write). A read or write that fails
// leaves it live: the caller asks again on its next poll.
func (b *Backend) judgeSession(ctx context.Context, id string) judgement {
	if b.isDead(id) {
		return judgement{dead: true}
	}
	name := b.sessionName(id)
	rctx, cancel := b.requestCtx(ctx, 0)
	gen, body, oc, err := b.readRaw(rctx, name)
	cancel()
	now := b.clock.Now()
	if oc != outcomeOK {
		b.log.WithError(err).WithField("session", id).Debug("could not read a session")
		return judgement{}
	}
	if gen == 0 {
		b.markDead(id)
		return judgement{dead: true}
	}
	doc, err := decodeSession(name, body)
	if err != nil {
		b.layoutProblem(name, err)
		return judgement{}
	}
	if doc.State == "dead" {
		b.markDead(id)
		return judgement{dead: true}
	}
	stale := time.Duration(doc.StaleMillis) * time.Millisecond
	if stale <= 0 {
		stale = b.cfg.TTL
	}
	b.obs.mu.Lock()
	s, ok := b.obs.seen[id]
	if !ok || s.gen != gen {
		s = sighting{gen: gen, first: now, stale: stale}
		b.obs.seen[id] = s
	}
	b.obs.mu.Unlock()
	at := s.first + s.stale
	if b.unsafeWallExpiry && b.wallNow().Sub(doc.Refreshed) > time.Duration(doc.TTLMillis)*time.Millisecond {
		at = now // test hook: the broken design the skew tests must catch
	}
	if now < at {
		return judgement{staleAt: at}
	}
	// Stale: declare it dead, on condition that it did not change.
	doc.State = "dead"
	doc.Write = b.newWriteID()
	rctx, cancel = b.requestCtx(ctx, 0)
	_, oc, err = b.write(rctx, name, gen, doc.encode(), doc.metadata())
	cancel()
	if oc != outcomeOK {
		// 412: it heartbeat meanwhile (the next read restarts the count);
		// no answer: the next poll reads what happened.
		b.log.WithError(err).WithField("session", id).Debug("could not declare a stale session dead")
		return judgement{staleAt: now}
	}
	b.markDead(id)
	b.stats.takeovers.Add(1)
	b.log.WithFields(logrus.Fields{"session": id, "host": doc.Host}).
		Warn("declared a session dead: no heartbeat seen for its TTL; its claims are void")
	return judgement{dead: true}
}

// liveConflicts returns the claims of cs whose session is not dead,
// judging each session once (in parallel), and the earliest instant one
// of them may turn stale (0 if none is known).
func (b *Backend) liveConflicts(ctx context.Context, cs []claimRef) ([]claimRef, time.Duration) {
	var ids []string
	sessions := map[string]judgement{}
	for _, c := range cs {
		if _, ok := sessions[c.session]; !ok {
			sessions[c.session] = judgement{}
			ids = append(ids, c.session)
		}
	}
	verdicts := make([]judgement, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			verdicts[i] = b.judgeSession(ctx, id)
		}()
	}
	wg.Wait()
	for i, id := range ids {
		sessions[id] = verdicts[i]
	}
	var live []claimRef
	var next time.Duration
	for _, c := range cs {
		j := sessions[c.session]
		if j.dead {
			continue
		}
		live = append(live, c)
		if j.staleAt != 0 && (next == 0 || j.staleAt < next) {
			next = j.staleAt
		}
	}
	return live, next
}

// layoutProblem logs, once per object, that it is in a layout this lockfs
// does not speak.
func (b *Backend) layoutProblem(name string, err error) {
	b.mu.Lock()
	seen := b.layoutLogged[name]
	b.layoutLogged[name] = true
	b.mu.Unlock()
	if !seen {
		b.log.WithError(err).WithField("object", name).Error("refusing a lock object of another layout")
	}
}
