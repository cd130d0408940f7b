package gcsbackend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/lockmgr"
)

// Claims: write, then verify.
//
// A claim on D in mode M first reads, in parallel, D's object, the
// directory-lock objects of D's ancestors (and D's own, for its new-dir and
// usage locks), and, for an exclusive directory claim, lists everything
// below D; a live conflicting record of another session there means wait
// (or ErrWouldBlock), with no write. Otherwise it writes its record into
// D's object (conditional on the generation read, refused if a live
// conflicting record is in that object; the write bumps the epoch), then
// reads the same set again: the verify step. Both sides of two conflicting
// claims write before they read, so at least one of them sees the other.
// Nothing seen: granted. Something seen: the claim that outranks every
// claim it saw keeps its record and polls until they vanish; the other
// withdraws its record (one write) and waits until what it saw is gone.
// A record granted is never withdrawn, except by release or loss.

// ownRec is this host's record in one lock object, held (a lease uses it)
// or warm (kept after release until wanted or idle).
type ownRec struct {
	id   lockmgr.LockID
	name string
	sess *session
	// slot (capacity 1) is held by the one operation on the record in
	// progress: claim, conversion, release, drop.
	slot chan struct{}

	// All fields below GUARDED_BY(Backend.mu).

	// present: the record is in the object (as far as this host knows).
	present bool
	// mode and epoch are the record's; tokens counts the tokens handed out
	// under epoch.
	mode          lockmgr.Mode
	epoch, tokens uint64
	// snap is the last version of the object this host read or wrote.
	snap snapshot
	// lease is the lease using the record; nil while warm.
	lease *lease
	// idleSince is when the record became warm.
	idleSince time.Duration
	// wanted: another host asked for it (wantedBy: which sessions); it is
	// dropped rather than kept warm.
	wanted   bool
	wantedBy map[string]bool
	// uncertain: a write of the record had an unknown outcome and may
	// still land. r stays in Backend.recs, so that the record is dropped
	// if another host asks for it, and is read once more WarmFor later
	// (dropIdle), until a write of ours to the object settles it.
	uncertain bool
}

func (r *ownRec) lock(ctx context.Context) error {
	select {
	case r.slot <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *ownRec) tryLock() bool {
	select {
	case r.slot <- struct{}{}:
		return true
	default:
		return false
	}
}

func (r *ownRec) unlock() { <-r.slot }

// scan is what one round of reads found.
type scan struct {
	own       snapshot   // D's object (if read)
	conflicts []claimRef // records of other sessions that conflict, not known dead
}

// scanFor reads what a claim on id in mode must check; withOwn includes
// D's own object (whose conflicting records are also returned). Records of
// session self and of sessions known dead are left out.
func (b *Backend) scanFor(ctx context.Context, id lockmgr.LockID, name string, mode lockmgr.Mode, self string, withOwn bool) (scan, error) {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		out  scan
		errs []error
	)
	add := func(cs []claimRef, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, c := range cs {
			if c.session != self && !b.isVoid(c.session) {
				out.conflicts = append(out.conflicts, c)
			}
		}
	}
	readObj := func(obj string, judge func(c *claimRec) bool, keep bool) {
		defer wg.Done()
		s, err := b.readRetry(ctx, obj, 0, b.newFailClock())
		if err != nil {
			add(nil, err)
			return
		}
		if keep {
			mu.Lock()
			out.own = s
			mu.Unlock()
		}
		var cs []claimRef
		if s.rec != nil {
			for i := range s.rec.Claims {
				if judge(&s.rec.Claims[i]) {
					cs = append(cs, s.rec.Claims[i].ref(obj))
				}
			}
			if t := s.rec.Next; withOwn && t != nil && t.Session != self {
				if c, ok := b.turnInWay(ctx, obj, t, id, mode); ok {
					cs = append(cs, c)
				}
			}
		}
		add(cs, nil)
	}
	exclusiveOnly := func(c *claimRec) bool { return c.mode() == lockmgr.Exclusive }
	if withOwn {
		wg.Add(1)
		go readObj(name, func(c *claimRec) bool { return lockmgr.Conflicts(mode, c.mode()) }, true)
	}
	if !b.noVerify {
		for _, a := range dirsAbove(id) {
			obj, err := objectName(b.cfg.Prefix, lockmgr.LockID{Path: a, Kind: lockmgr.KindDir})
			if err != nil {
				return scan{}, err
			}
			wg.Add(1)
			go readObj(obj, exclusiveOnly, false)
		}
		if id.Kind == lockmgr.KindDir && mode == lockmgr.Exclusive {
			// Everything inside id.Path is in one listing of its
			// prefix, long-named locks included (longBase), unless the
			// path is so long that these are under an ancestor's.
			wg.Add(1)
			go func() {
				defer wg.Done()
				add(b.listBelow(ctx, dirPrefix(b.cfg.Prefix, id.Path), name, nil))
			}()
			if b.listLegacyLong {
				// The test seam: the listing of every long-named
				// lock that the layout before longBase needed.
				wg.Add(1)
				go func() {
					defer wg.Done()
					add(b.listBelow(ctx, b.cfg.Prefix+"locks-long/", name, func(lock string) bool {
						return inside(id.Path, lock)
					}))
				}()
			}
			if !fitsLongBase(b.cfg.Prefix, id.Path) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					add(b.listBelow(ctx, longBase(b.cfg.Prefix, id.Path), name, func(lock string) bool {
						return inside(id.Path, lock)
					}))
				}()
			}
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		return scan{}, errs[0]
	}
	return out, nil
}

// dirsAbove lists the directory locks a claim on id holds shared
// implicitly: every proper ancestor of id's directory, and the directory
// itself for the new-dir and usage kinds.
func dirsAbove(id lockmgr.LockID) []string {
	var out []string
	if id.Path != "." {
		out = append(out, ".")
		for i := 0; i < len(id.Path); i++ {
			if id.Path[i] == '/' {
				out = append(out, id.Path[:i])
			}
		}
	}
	if id.Kind != lockmgr.KindDir {
		out = append(out, id.Path)
	}
	return out
}

// inside reports whether the lock lock ("a/b/.lock_newdir", as
// LockID.String spells it) is in directory dir or below.
func inside(dir, lock string) bool {
	return dir == "." || strings.HasPrefix(lock, dir+"/")
}

// listBelow lists the objects under prefix, except skip, and returns their
// records, read from the metadata; keep, if set, filters by lock. An
// object without layout-2 metadata is read: a layout-1 object with claims
// is refused (ErrLayout).
func (b *Backend) listBelow(ctx context.Context, prefix, skip string, keep func(lock string) bool) ([]claimRef, error) {
	items, err := b.listRetry(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var out []claimRef
	for _, it := range items {
		if it.name == skip {
			continue
		}
		if keep != nil && !keep(it.meta[metaPath]) {
			continue
		}
		if it.meta[metaVersion] != "2" {
			s, err := b.readRetry(ctx, it.name, 0, b.newFailClock())
			if err != nil {
				return nil, err
			}
			if s.rec != nil {
				for i := range s.rec.Claims {
					out = append(out, s.rec.Claims[i].ref(it.name))
				}
			}
			continue
		}
		cs, err := parseClaimsMeta(it.name, it.meta[metaClaims])
		if err != nil {
			return nil, err
		}
		out = append(out, cs...)
	}
	return out, nil
}

// listRetry lists prefix, retrying transient failures with backoff for at
// most UnavailableAfter.
func (b *Backend) listRetry(ctx context.Context, prefix string) ([]listed, error) {
	bo := backoff.New(retryMin, retryMax)
	fails := b.newFailClock()
	for {
		rctx, cancel := b.requestCtx(ctx, 0)
		items, oc, err := b.list(rctx, prefix)
		cancel()
		switch oc {
		case outcomeOK:
			return items, nil
		case outcomeCanceled:
			return nil, ctx.Err()
		case outcomeTransient:
			if err := fails.fail(err); err != nil {
				return nil, err
			}
			if err := b.sleep(ctx, bo.Next()); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("list %s: %w", prefix, err)
		}
	}
}

// acquireRec brings r to mode: scan, write, verify, as described at the
// top of this file. keep is the mode to fall back to when the record must
// be withdrawn (a held shared record being upgraded), 0 to drop it. pre,
// if not nil, is a scan made for this claim already, used for the first
// round. since is when the caller began to want the lock: its wants carry
// it, and holders give turns in its order. The caller holds r's slot.
func (b *Backend) acquireRec(ctx context.Context, r *ownRec, mode lockmgr.Mode, wait bool, giveUp time.Duration, keep lockmgr.Mode, pre *scan, since time.Time) error {
	self := r.sess.id
	asked := newAsks(b, self, r.id, mode, since)
	defer asked.withdraw()
	poll := b.newPoll()
	// A claim without wait that finds records in its way asks their
	// holders and gives them about one want poll to drop them, if they
	// only keep them warm: a warm record of another host must not make
	// flock -n fail.
	var askUntil time.Duration
	for {
		var sc scan
		if pre != nil {
			sc, pre = *pre, nil
		} else {
			var err error
			if sc, err = b.scanFor(ctx, r.id, r.name, mode, self, true); err != nil {
				return err
			}
		}
		live, nextStale := b.liveConflicts(ctx, sc.conflicts)
		if len(live) > 0 {
			if !wait {
				now := b.clock.Now()
				if askUntil == 0 {
					askUntil = now + b.cfg.WantPoll + b.cfg.WantPoll/2
				}
				if now >= askUntil {
					return lockmgr.ErrWouldBlock
				}
				asked.ask(ctx, live)
				if err := b.pollSleep(ctx, poll, earliest(nextStale, askUntil)); err != nil {
					return err
				}
				continue
			}
			if err := b.upgradeDeadlock(r, keep, live); err != nil {
				return err
			}
			b.mu.Lock()
			giveBack := keep == 0 && r.present && r.wanted
			b.mu.Unlock()
			if giveBack {
				// A weaker warm record of ours, which another host asked
				// for: the poller cannot drop it while this claim holds
				// the record, so this claim does (and keeps r known: it
				// may write r's record again).
				if err := b.dropRec(ctx, r, false); err != nil {
					return err
				}
			}
			asked.ask(ctx, live)
			if err := b.pollSleep(ctx, poll, nextStale); err != nil {
				return err
			}
			continue
		}
		own, err := b.writeRec(ctx, r, sc.own, mode, giveUp)
		var blocked *errBlocked
		if errors.As(err, &blocked) {
			if !wait {
				return lockmgr.ErrWouldBlock
			}
			poll.Reset()
			if err := b.pollSleep(ctx, poll, 0); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if b.noVerify {
			return nil
		}
		// Verify.
		for {
			vc, err := b.scanFor(ctx, r.id, r.name, mode, self, false)
			if err != nil {
				b.withdraw(r, keep)
				return err
			}
			live, nextStale := b.liveConflicts(ctx, vc.conflicts)
			if len(live) == 0 {
				return nil
			}
			first := true
			for _, c := range live {
				if !outranks(own, c) {
					first = false
				}
			}
			if !first || !wait {
				if err := b.withdraw(r, keep); err != nil {
					return err
				}
				b.stats.withdrawals.Add(1)
				if !wait {
					return lockmgr.ErrWouldBlock
				}
				asked.ask(ctx, live)
				break
			}
			// This claim outranks every claim it saw: keep the record
			// and wait for them to go.
			asked.ask(ctx, live)
			if err := b.pollSleep(ctx, poll, nextStale); err != nil {
				b.withdraw(r, keep)
				return err
			}
		}
		if err := b.pollSleep(ctx, poll, nextStale); err != nil {
			return err
		}
	}
}

// earliest returns the earlier of two instants, 0 meaning none.
func earliest(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// pollSleep waits for the next poll, or until a blocker may turn stale.
func (b *Backend) pollSleep(ctx context.Context, poll *backoff.Backoff, nextStale time.Duration) error {
	d := poll.Next()
	if nextStale != 0 {
		d = min(d, max(nextStale-b.clock.Now(), time.Millisecond))
	}
	return b.sleep(ctx, d)
}

// writeRec writes r's record in mode with a new epoch into its object,
// starting from cur, removing the records of dead sessions. It returns the
// record's priority. A live conflicting record of another session in the
// object refuses the write with errBlocked.
func (b *Backend) writeRec(ctx context.Context, r *ownRec, cur snapshot, mode lockmgr.Mode, giveUp time.Duration) (claimRef, error) {
	self := r.sess.id
	since := b.wallNow()
	var epoch uint64
	res, err := b.mutate(ctx, r.name, mutateOpts{base: &cur, giveUp: giveUp}, func(cur snapshot) (*record, error) {
		rec := cur.rec.clone(r.id.String())
		rec.Lock = r.id.String()
		rec.Claims = rec.without(func(c *claimRec) bool { return c.Session != self && b.isVoid(c.Session) })
		for i := range rec.Claims {
			c := &rec.Claims[i]
			if c.Session != self && lockmgr.Conflicts(mode, c.mode()) {
				return nil, &errBlocked{c: c.ref(r.name), gen: cur.gen}
			}
		}
		rec.Claims = rec.without(func(c *claimRec) bool { return c.Session == self })
		if rec.Next != nil && (rec.Next.Session == self || b.isDead(rec.Next.Session)) {
			rec.Next = nil // this claim's turn came, or its waiter is gone
		}
		rec.Epoch++
		epoch = rec.Epoch
		rec.Claims = append(rec.Claims, claimRec{Session: self, Host: b.cfg.HostID, Mode: modeName(mode), Epoch: rec.Epoch, Since: since})
		return rec, nil
	}, func(rec *record) bool {
		c := rec.find(self)
		return c != nil && c.Epoch == epoch && c.Mode == modeName(mode)
	})
	var amb *errAmbiguous
	if errors.As(err, &amb) {
		// The write may still land: make sure it does not stay.
		b.mu.Lock()
		r.present, r.uncertain = true, true
		r.idleSince = b.clock.Now()
		b.mu.Unlock()
		b.dropLater(r)
		return claimRef{}, err
	}
	if err != nil {
		return claimRef{}, err
	}
	c := res.snap.rec.find(self)
	b.mu.Lock()
	defer b.mu.Unlock()
	r.snap = res.snap
	r.present = c != nil
	r.uncertain = false // a write that landed after it fails its precondition
	if c == nil {
		return claimRef{}, fmt.Errorf("internal error: claim on %s landed without its record", r.id)
	}
	if c.Epoch != r.epoch {
		r.epoch, r.tokens = c.Epoch, 0
	}
	r.mode = c.mode()
	return c.ref(r.name), nil
}

// withdraw takes r's record back after the verify step saw a claim with
// priority: back to mode keep, or dropped if keep is 0. r stays in
// Backend.recs: the claim may go on and write its record again, which
// serveWants must then find to drop when asked (the claim forgets r
// itself if it fails without a record).
func (b *Backend) withdraw(r *ownRec, keep lockmgr.Mode) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.closeCtx), b.cfg.UnavailableAfter)
	defer cancel()
	if keep == 0 {
		return b.dropRec(ctx, r, false)
	}
	return b.setMode(ctx, r, keep)
}

// drop removes r's record from its object (one conditional write), taking
// r's slot.
func (b *Backend) drop(ctx context.Context, r *ownRec) error {
	if err := r.lock(ctx); err != nil {
		return err
	}
	defer r.unlock()
	return b.dropLocked(ctx, r)
}

// dropLocked removes r's record and forgets r unless a lease uses it; the
// caller holds r's slot.
func (b *Backend) dropLocked(ctx context.Context, r *ownRec) error {
	return b.dropRec(ctx, r, true)
}

// dropRec removes r's record; the caller holds r's slot. With forget, r
// leaves Backend.recs unless a lease uses it. A claim in progress on r
// drops with forget false: if it then writes r's record again, a record
// missing from recs could never be dropped when another host asks for it,
// nor when idle, and would block that host for the life of the session.
func (b *Backend) dropRec(ctx context.Context, r *ownRec, forget bool) error {
	self := r.sess.id
	b.mu.Lock()
	base := r.snap
	present := r.present
	uncertain := r.uncertain
	b.mu.Unlock()
	if !present {
		return nil
	}
	o := mutateOpts{}
	if base.gen != 0 && !uncertain { // a late write is not in base: read
		o.base = &base
	}
	next := b.nextTurn(ctx, r)
	res, err := b.mutate(ctx, r.name, o, func(cur snapshot) (*record, error) {
		if cur.rec.find(self) == nil {
			return nil, errNoChange
		}
		rec := cur.rec.clone("")
		rec.Claims = rec.without(func(c *claimRec) bool { return c.Session == self || b.isVoid(c.Session) })
		if next != nil {
			rec.Next = next
		}
		return rec, nil
	}, func(rec *record) bool { return rec.find(self) == nil })
	if err != nil {
		return err
	}
	b.mu.Lock()
	r.snap = res.snap
	r.present = false
	r.wanted = false
	clear(r.wantedBy)
	if res.wrote {
		r.uncertain = false
	}
	if forget && !r.uncertain && b.recs[r.name] == r && r.lease == nil {
		delete(b.recs, r.name)
	}
	b.mu.Unlock()
	b.stats.releases.Add(1)
	return nil
}

// setMode rewrites r's record in mode (a downgrade, or an upgrade taken
// back), keeping its epoch; the caller holds r's slot.
func (b *Backend) setMode(ctx context.Context, r *ownRec, mode lockmgr.Mode) error {
	self := r.sess.id
	b.mu.Lock()
	base := r.snap
	b.mu.Unlock()
	res, err := b.mutate(ctx, r.name, mutateOpts{base: &base}, func(cur snapshot) (*record, error) {
		rec := cur.rec.clone("")
		c := rec.find(self)
		if c == nil {
			return nil, errGone
		}
		if c.Mode == modeName(mode) {
			return nil, errNoChange
		}
		c.Mode = modeName(mode)
		return rec, nil
	}, func(rec *record) bool {
		c := rec.find(self)
		return c != nil && c.Mode == modeName(mode)
	})
	if err != nil {
		return err
	}
	b.mu.Lock()
	r.snap = res.snap
	r.mode = mode
	b.mu.Unlock()
	return nil
}

// dropLater drops r's record in the background (a claim given up with its
// write in flight, a warm record wanted by another host).
func (b *Backend) dropLater(r *ownRec) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return // Close drops every record
	}
	b.workers.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.workers.Done()
		ctx, cancel := context.WithTimeout(b.closeCtx, b.cfg.UnavailableAfter)
		defer cancel()
		if err := r.lock(ctx); err != nil {
			return
		}
		defer r.unlock()
		b.mu.Lock()
		inUse := r.lease != nil
		b.mu.Unlock()
		if inUse {
			return
		}
		if err := b.dropLocked(ctx, r); err != nil && b.closeCtx.Err() == nil {
			b.log.WithError(err).WithField("lock", r.id.String()).Warn("could not drop a record; it goes with the session")
		}
	}()
}

// upgradeDeadlock: r is held shared and waits to become exclusive, blocked
// by another host's shared record that waits for r's (it asked for it):
// the two would wait for each other for ever. The claim with priority
// waits; the other gives way with ErrDeadlock.
func (b *Backend) upgradeDeadlock(r *ownRec, keep lockmgr.Mode, live []claimRef) error {
	if keep != lockmgr.Shared {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range live {
		if !c.turn && c.object == r.name && c.mode == lockmgr.Shared && r.wantedBy[c.session] && c.session < r.sess.id {
			return fmt.Errorf("%w: host %q, holding %s shared too, waits to upgrade and has priority",
				lockmgr.ErrDeadlock, c.host, r.id)
		}
	}
	return nil
}
