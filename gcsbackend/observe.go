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
// Lock-delay: the records of a session declared dead still count, on each
// host, for the session's lock-delay after that host first knew it dead
// (declared it, or read it declared), so that a host that was paused or
// cut off, and on waking finds its session gone, stops its holders before
// anyone else enters. The delay is measured from this host's own
// knowledge, on its own clock: the declaration came before it, so no
// host counts it from an instant earlier than the declaration. A missing
// session ended cleanly (its host deleted it after dropping its records):
// its records count as absent at once, as do the records of this host's
// own lost sessions.
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
	// lost ones), each with the instant from which its records count as
	// absent (its lock-delay's end). GUARDED_BY(mu)
	dead map[string]time.Duration
	// delayed: the dead sessions whose lock-delay kept a claim of this
	// host waiting (counted and logged once). GUARDED_BY(mu)
	delayed map[string]bool
	// turns maps a turn (object and turn id) to when this host first saw
	// it. GUARDED_BY(mu)
	turns map[string]time.Duration
}

// sighting is the first read that showed a session's current generation.
type sighting struct {
	gen   int64
	first time.Duration
	stale time.Duration
}

func newObservations() *observations {
	return &observations{seen: make(map[string]sighting), dead: make(map[string]time.Duration), delayed: make(map[string]bool),
		turns: make(map[string]time.Duration)}
}

// markDead remembers that session id is dead, its records counting as
// absent from voidAt on (this host's clock). The first knowledge counts.
func (b *Backend) markDead(id string, voidAt time.Duration) {
	b.obs.mu.Lock()
	if _, ok := b.obs.dead[id]; !ok {
		b.obs.dead[id] = voidAt
	}
	delete(b.obs.seen, id)
	b.obs.mu.Unlock()
}

// isDead reports whether session id is known dead or missing.
func (b *Backend) isDead(id string) bool {
	_, dead := b.deadUntil(id)
	return dead
}

// deadUntil reports whether session id is known dead or missing, and from
// when (this host's clock) its records count as absent: the end of its
// lock-delay.
func (b *Backend) deadUntil(id string) (until time.Duration, dead bool) {
	b.obs.mu.Lock()
	defer b.obs.mu.Unlock()
	until, dead = b.obs.dead[id]
	return until, dead
}

// isVoid reports whether session id is known dead and past its
// lock-delay: its records count as absent, and whoever writes their object
// removes them.
func (b *Backend) isVoid(id string) bool {
	until, dead := b.deadUntil(id)
	return dead && b.clock.Now() >= until
}

// lockDelayOf is the lock-delay a session asks for in its object, or this
// host's own for a session that does not say.
func (b *Backend) lockDelayOf(doc *sessionDoc) time.Duration {
	if doc.LockDelayMillis == nil {
		return b.cfg.lockDelay()
	}
	return max(time.Duration(*doc.LockDelayMillis)*time.Millisecond, 0)
}

// judgement is what a host makes of another host's session.
type judgement struct {
	// dead: declared dead or missing; its records count until until (this
	// host's clock), the end of its lock-delay.
	dead  bool
	until time.Duration
	// staleAt is when it turns stale if its generation stays, on this
	// host's clock; 0 if unknown.
	staleAt time.Duration
}

// judgeSession reads session id's object and says whether it is dead: gone,
// declared dead, or seen unchanged for its stale period, in which case this
// host declares it dead (one conditional write). A read or write that fails
// leaves it live: the caller asks again on its next poll.
func (b *Backend) judgeSession(ctx context.Context, id string) judgement {
	if until, dead := b.deadUntil(id); dead {
		return judgement{dead: true, until: until}
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
		b.markDead(id, now) // ended cleanly
		return judgement{dead: true, until: now}
	}
	doc, err := decodeSession(name, body)
	if err != nil {
		b.layoutProblem(name, err)
		return judgement{}
	}
	if doc.State == "dead" {
		b.markDead(id, now+b.lockDelayOf(doc))
		until, _ := b.deadUntil(id)
		return judgement{dead: true, until: until}
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
	now = b.clock.Now()
	delay := b.lockDelayOf(doc)
	b.markDead(id, now+delay)
	b.stats.takeovers.Add(1)
	b.log.WithFields(logrus.Fields{"session": id, "host": doc.Host, "lock_delay": delay}).
		Warn("declared a session dead: no heartbeat seen for its TTL; its claims are void after its lock-delay")
	b.removeBell(ctx, id)
	until, _ := b.deadUntil(id)
	return judgement{dead: true, until: until}
}

// liveConflicts returns the claims of cs whose session is not dead,
// judging each session once (in parallel), and the earliest instant one
// of them may turn stale (0 if none is known).
func (b *Backend) liveConflicts(ctx context.Context, cs []claimRef) ([]claimRef, time.Duration) {
	var ids []string
	sessions := map[string]judgement{}
	for _, c := range cs {
		if c.turn {
			continue // its end bounds it; the waiter's session is not judged
		}
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
	now := b.clock.Now()
	for _, c := range cs {
		if c.turn {
			if now < c.turnEnd {
				live = append(live, c)
				next = earliest(next, c.turnEnd)
			}
			continue
		}
		j := sessions[c.session]
		at := j.staleAt
		if j.dead {
			if now >= j.until {
				continue
			}
			at = j.until
			b.noteDelay(c)
		}
		live = append(live, c)
		next = earliest(next, at)
	}
	return live, next
}

// noteDelay counts and logs, once per session, that a dead session's
// record c keeps a claim of this host waiting for its lock-delay.
func (b *Backend) noteDelay(c claimRef) {
	b.obs.mu.Lock()
	seen := b.obs.delayed[c.session]
	b.obs.delayed[c.session] = true
	b.obs.mu.Unlock()
	if seen {
		return
	}
	b.stats.lockDelays.Add(1)
	until, _ := b.deadUntil(c.session)
	b.log.WithFields(logrus.Fields{"session": c.session, "host": c.host, "lock": c.object,
		"lock_delay_left": (until - b.clock.Now()).Round(time.Millisecond)}).
		Info("a dead session's locks are kept for its lock-delay, so that its host can stop its holders if it was only paused")
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
