package gcsbackend

// Serving the wants of other hosts: the poller lists this session's wants
// when its bell rings or a poll is due, marks the records wanted, and drops
// the warm ones (their holders have let go).

import (
	"strconv"
	"time"

	"github.com/lockfs/lockfs/internal/backoff"
)

// wantPoller serves the wants addressed to this session and drops warm
// records idle for WarmFor.
func (b *Backend) wantPoller() {
	defer b.workers.Done()
	for {
		if err := b.sleep(b.closeCtx, backoff.Jitter(b.cfg.WantPoll)); err != nil {
			return
		}
		s := b.currentSession()
		if s == nil {
			continue
		}
		if due, bell := b.wantsDue(s); due {
			b.serveWants(s, bell)
		}
		b.dropIdle(s)
	}
}

// wantsDue reports whether the wants of s are to be listed now, and the
// generation of its bell read for it (-1 if none was read). Without
// records, nothing is sent: no want can concern this host. With records,
// held or warm, one metadata read of the bell: listed if it rang since
// the last listing, or if wants were known at the last listing and a
// RefreshInterval has passed (to learn that they are gone).
func (b *Backend) wantsDue(s *session) (bool, int64) {
	if b.pollWants.Load() {
		return b.wantsDueByPoll(s), -1
	}
	now := b.clock.Now()
	b.mu.Lock()
	has := false
	for _, r := range b.recs {
		if r.sess == s && (r.lease != nil || r.present || r.uncertain) {
			has = true
			break
		}
	}
	recheck := len(b.wants) > 0 && now-b.wantsListed >= b.cfg.RefreshInterval
	b.mu.Unlock()
	if !has {
		return false, -1
	}
	gen, rang, ok := b.bellRang(s)
	if !ok {
		return recheck, -1
	}
	return rang || recheck, gen
}

// wantsDueByPoll is the want path before bells, kept as the control of
// the tests of its cost (Backend.pollWants): list at every poll while s
// has a warm record, every RefreshInterval while it only has held ones.
func (b *Backend) wantsDueByPoll(s *session) bool {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	held := false
	for _, r := range b.recs {
		if r.sess != s {
			continue
		}
		if r.lease == nil && (r.present || r.uncertain) {
			return true
		}
		held = held || r.lease != nil
	}
	return held && now-b.wantsListed >= b.cfg.RefreshInterval
}

// serveWants lists the wants addressed to s and acts on them: a warm
// record wanted is dropped at once; a held one is marked to be dropped at
// its release, and its lease reports itself contended; the list is kept
// for deferTo. Wants of dead waiters are deleted. bell is the generation
// of s's bell read before the listing (-1 if none was).
func (b *Backend) serveWants(s *session, bell int64) {
	ctx, cancel := b.requestCtx(b.closeCtx, 0)
	items, oc, err := b.list(ctx, b.cfg.Prefix+"wants/"+s.id+"/")
	cancel()
	if oc != outcomeOK {
		if b.closeCtx.Err() == nil {
			b.log.WithError(err).Debug("could not list the wants of this session")
		}
		return
	}
	if bell >= 0 {
		s.mu.Lock()
		s.bellSeen = bell
		s.mu.Unlock()
	}
	ws := b.parseWants(items)
	warm, contended := b.markWanted(s, ws)
	for _, l := range contended {
		l.contend()
	}
	for _, r := range warm {
		b.stats.wantsServed.Add(1)
		b.dropLater(r)
	}
}

// parseWants turns the listed wants of this session into wants, each
// first seen when it was first listed; the wants of dead or gone waiters
// are deleted instead.
func (b *Backend) parseWants(items []listed) []want {
	var ws []want
	now := b.clock.Now()
	b.mu.Lock()
	b.wantsListed = now
	seen := make(map[string]time.Duration, len(b.wants))
	for _, w := range b.wants {
		seen[w.name] = w.seen
	}
	b.mu.Unlock()
	for _, it := range items {
		w := want{name: it.name, object: it.meta[metaWantObject], waiter: it.meta[metaWantWaiter], mode: parseMode(it.meta[metaWantMode])}
		id, err := parseLockID(it.meta[metaWantLock])
		if w.waiter == "" || err != nil {
			continue // not a want of this layout
		}
		w.lock = id
		w.since, _ = strconv.ParseInt(it.meta[metaWantSince], 10, 64)
		w.host = it.meta[metaWantHost]
		w.seen = now
		if t, ok := seen[w.name]; ok {
			w.seen = t
		}
		if b.isDead(w.waiter) || b.waiterGone(w.waiter) {
			ctx, cancel := b.requestCtx(b.closeCtx, 0)
			_ = b.removeWant(ctx, it.name)
			cancel()
			continue
		}
		ws = append(ws, w)
	}
	return ws
}

// markWanted records ws as the session's wants and marks each record of
// session s that another host wants: it returns the warm records (no
// lease: to drop) and the leases of held ones (contended).
func (b *Backend) markWanted(s *session, ws []want) (warm []*ownRec, contended []*lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.wants = ws
	wantedBy := map[string]map[string]bool{}
	for _, w := range ws {
		if wantedBy[w.object] == nil {
			wantedBy[w.object] = map[string]bool{}
		}
		wantedBy[w.object][w.waiter] = true
	}
	for name, r := range b.recs {
		if r.sess == s && r.uncertain && !r.present && r.lease == nil && len(wantedBy[name]) > 0 {
			// Another host waits for a record that a write of unknown
			// outcome may have left after all: read the object and
			// drop it if it is there.
			r.present = true
		}
	}
	for name, r := range b.recs {
		if r.sess != s || !r.present {
			continue
		}
		if by := wantedBy[name]; len(by) > 0 {
			r.wanted = true
			r.wantedBy = by
			if r.lease == nil {
				warm = append(warm, r)
			} else {
				contended = append(contended, r.lease)
			}
		} else {
			r.wanted = false
			r.wantedBy = nil
		}
	}
	return warm, contended
}

// waiterGone judges, at most once per TTL per waiter, whether the session
// of a waiter that still has a want here is dead.
func (b *Backend) waiterGone(waiter string) bool {
	now := b.clock.Now()
	b.mu.Lock()
	last, ok := b.waiterChecked[waiter]
	if ok && now-last < b.cfg.TTL {
		b.mu.Unlock()
		return false
	}
	b.waiterChecked[waiter] = now
	b.mu.Unlock()
	return b.judgeSession(b.closeCtx, waiter).dead
}

// dropIdle drops the warm records of s idle for WarmFor.
func (b *Backend) dropIdle(s *session) {
	if b.cfg.WarmFor < 0 {
		return
	}
	now := b.clock.Now()
	var idle []*ownRec
	b.mu.Lock()
	for r := range b.unleased {
		if b.recs[r.name] != r || r.lease != nil {
			delete(b.unleased, r)
			continue
		}
		if r.sess != s || now-r.idleSince < b.cfg.WarmFor {
			continue
		}
		if r.uncertain && !r.present {
			// A last look, WarmFor after a write of unknown outcome:
			// drop the record if it landed after all, then forget it.
			r.present, r.uncertain = true, false
		}
		if r.present {
			idle = append(idle, r)
		}
	}
	b.mu.Unlock()
	for _, r := range idle {
		b.dropLater(r)
	}
}
