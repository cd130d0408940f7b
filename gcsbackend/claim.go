package gcsbackend

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

	// The record's slot is held by the one operation on the record in
	// progress: claim, conversion, release, drop (lock, unlock, below).
	// slotBusy: it is held; slotWait: the operations waiting for it, in
	// order, nil while none waits. Both GUARDED_BY(slotMu), which is
	// taken only inside lock and unlock, around no other lock or call.
	// (A channel of capacity 1 did the same for 96 bytes more per
	// record, waited for or not: 9 MiB for 100,000 held locks.)
	slotMu   sync.Mutex
	slotWait *[]chan struct{}

	// All fields below but slotBusy GUARDED_BY(Backend.mu). (The small
	// ones first, side by side: one word for the six keeps a held lock's
	// ownRec in the 144-byte size class; TestOwnRecSize.)

	slotBusy bool
	// present: the record is in the object (as far as this host knows).
	present bool
	// wanted: another host asked for it (wantedBy: which sessions); it is
	// dropped rather than kept warm.
	wanted bool
	// uncertain: a write of the record had an unknown outcome and may
	// still land. r stays in Backend.recs, so that the record is dropped
	// if another host asks for it, and is read once more WarmFor later
	// (dropIdle), until a write of ours to the object settles it.
	uncertain bool
	// mode and epoch are the record's; tokens counts the tokens handed out
	// under epoch.
	mode lockmgr.Mode
	// ownMode, with gen, rec, ownEpoch and ownSince: the last version of
	// the object this host read or wrote, the lock's own claim alone kept
	// as its fields (snapOfLocked, setSnapLocked in record.go).
	ownMode       lockmgr.Mode
	epoch, tokens uint64
	gen           int64
	rec           *record
	ownEpoch      uint64
	ownSince      int64
	// lease is the lease using the record; nil while warm.
	lease *lease
	// idleSince is when the record became warm.
	idleSince time.Duration
	// wantedBy: the sessions that asked for it (wanted).
	wantedBy map[string]bool
}

// lock takes r's slot, waiting for it until ctx ends.
func (r *ownRec) lock(ctx context.Context) error {
	r.slotMu.Lock()
	if !r.slotBusy {
		r.slotBusy = true
		r.slotMu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	if r.slotWait == nil {
		r.slotWait = new([]chan struct{})
	}
	*r.slotWait = append(*r.slotWait, ch)
	r.slotMu.Unlock()
	select {
	case <-ch:
		return nil // unlock handed the slot on to this operation
	case <-ctx.Done():
	}
	r.slotMu.Lock()
	if r.slotWait != nil {
		if i := slices.Index(*r.slotWait, ch); i >= 0 {
			*r.slotWait = slices.Delete(*r.slotWait, i, i+1)
			r.dropSlotWaitLocked()
			r.slotMu.Unlock()
			return ctx.Err()
		}
	}
	r.slotMu.Unlock()
	// Handed on meanwhile: the slot is this operation's, which does not
	// want it any more.
	r.unlock()
	return ctx.Err()
}

// unlock gives r's slot back, to the operation that has waited longest
// if one waits.
func (r *ownRec) unlock() {
	r.slotMu.Lock()
	defer r.slotMu.Unlock()
	if !r.slotBusy {
		panic("gcsbackend: unlock of a record slot nobody holds")
	}
	if r.slotWait == nil {
		r.slotBusy = false
		return
	}
	q := *r.slotWait
	close(q[0]) // the slot stays busy: it is q[0]'s now
	q[0] = nil
	*r.slotWait = q[1:]
	r.dropSlotWaitLocked()
}

// dropSlotWaitLocked forgets an empty wait queue.
func (r *ownRec) dropSlotWaitLocked() {
	if len(*r.slotWait) == 0 {
		r.slotWait = nil
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
	a := &acquisition{r: r, mode: mode, wait: wait, keep: keep, asked: newAsks(b, self, r.id, mode, since), poll: b.newPoll()}
	defer a.asked.withdraw()
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
			if err := b.waitForLive(ctx, a, live, nextStale); err != nil {
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
			a.poll.Reset()
			if err := b.pollSleep(ctx, a.poll, 0); err != nil {
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
		if held, err := b.verifyRec(ctx, a, own); held || err != nil {
			return err
		}
		if err := b.pollSleep(ctx, a.poll, nextStale); err != nil {
			return err
		}
	}
}

// acquisition is what one acquireRec keeps across its rounds.
type acquisition struct {
	r    *ownRec
	mode lockmgr.Mode
	wait bool
	keep lockmgr.Mode // the mode r holds already (an upgrade), 0 if none
	// asked are the wants this claim wrote to the holders in its way.
	asked *asks
	poll  *backoff.Backoff
	// askUntil: a claim without wait that finds records in its way asks
	// their holders and gives them about one want poll to drop them, if
	// they only keep them warm: a warm record of another host must not
	// make flock -n fail. 0 until the first such round.
	askUntil time.Duration
}

// waitForLive decides a round whose scan found live records in the way:
// without wait, ask their holders and poll until askUntil, then
// ErrWouldBlock; with wait, refuse an upgrade deadlock, give back a weaker
// warm record of ours that another host wants, ask, and poll.
func (b *Backend) waitForLive(ctx context.Context, a *acquisition, live []claimRef, nextStale time.Duration) error {
	if !a.wait {
		now := b.clock.Now()
		if a.askUntil == 0 {
			a.askUntil = now + b.cfg.WantPoll + b.cfg.WantPoll/2
		}
		if now >= a.askUntil {
			return lockmgr.ErrWouldBlock
		}
		a.asked.ask(ctx, live)
		return b.pollSleep(ctx, a.poll, earliest(nextStale, a.askUntil))
	}
	if err := b.upgradeDeadlock(a.r, a.keep, live); err != nil {
		return err
	}
	b.mu.Lock()
	giveBack := a.keep == 0 && a.r.present && a.r.wanted
	b.mu.Unlock()
	if giveBack {
		// A weaker warm record of ours, which another host asked for: the
		// poller cannot drop it while this claim holds the record, so
		// this claim does (and keeps r known: it may write r's record
		// again).
		if err := b.dropRec(ctx, a.r, false); err != nil {
			return err
		}
	}
	a.asked.ask(ctx, live)
	return b.pollSleep(ctx, a.poll, nextStale)
}

// verifyRec scans again after own was written: held when no live record
// conflicts. A claim that outranks every record it sees keeps its own and
// waits for them to go; otherwise it withdraws its record (ErrWouldBlock
// without wait) and the caller tries again.
func (b *Backend) verifyRec(ctx context.Context, a *acquisition, own claimRef) (held bool, _ error) {
	r := a.r
	for {
		vc, err := b.scanFor(ctx, r.id, r.name, a.mode, r.sess.id, false)
		if err != nil {
			b.withdraw(r, a.keep)
			return false, err
		}
		live, nextStale := b.liveConflicts(ctx, vc.conflicts)
		if len(live) == 0 {
			return true, nil
		}
		first := true
		for _, c := range live {
			if !outranks(own, c) {
				first = false
			}
		}
		if !first || !a.wait {
			if err := b.withdraw(r, a.keep); err != nil {
				return false, err
			}
			b.stats.withdrawals.Add(1)
			if !a.wait {
				return false, lockmgr.ErrWouldBlock
			}
			a.asked.ask(ctx, live)
			return false, nil
		}
		// This claim outranks every claim it saw: keep the record and
		// wait for them to go.
		a.asked.ask(ctx, live)
		if err := b.pollSleep(ctx, a.poll, nextStale); err != nil {
			b.withdraw(r, a.keep)
			return false, err
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
	b.setSnapLocked(r, res.snap)
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
