package gcsbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/lockmgr"
)

// Fencing tokens are epoch<<tokenBits | n, where epoch is the claim's epoch
// from the lock object and n counts the grants this host made under it.
const (
	tokenBits      = 20
	maxLocalTokens = 1<<tokenBits - 1
)

// errGone: the claim's entry is no longer in the lock object.
var errGone = errors.New("the claim was removed from the lock object by another host, which judged it stale")

// lease is this host's claim on one lock: an entry in the lock's object,
// refreshed by the backend's refresher.
//
// The engine calls one of Convert and Release at a time per lock; NextToken,
// Mode, Done, Err and Describe may be called at any time. The claim's writes
// (refresh, conversion, a new epoch, release) go one at a time through wsem.
type lease struct {
	// Dependencies
	b *Backend

	// Constant data
	id    lockmgr.LockID
	name  string        // object name
	claim string        // claim id
	lostc chan struct{} // closed once the lease is lost
	wsem  chan struct{} // capacity 1: held by the one write of this claim in flight

	// Mutable state
	mu sync.Mutex
	// mode is the claim's mode; 0 once lost or released. GUARDED_BY(mu)
	mode lockmgr.Mode
	// seq is the entry's Seq in our last landed write. GUARDED_BY(mu)
	seq uint64
	// epoch is the claim's epoch; tokens the local tokens handed out under
	// it. GUARDED_BY(mu)
	epoch, tokens uint64
	// snap is the last version of the object this lease wrote. GUARDED_BY(mu)
	snap snapshot
	// lastSent is when the last landed write was (first) sent; validUntil
	// is lastSent + TTL - Margin: the end of this host's vouching.
	// INVARIANT: validUntil == lastSent + cfg.vouch(). GUARDED_BY(mu)
	lastSent, validUntil time.Duration
	// upgrading: a Convert to exclusive is waiting; the entry says so.
	// GUARDED_BY(mu)
	upgrading bool
	// refreshDue is when the next refresh should start; refreshing says a
	// refresh goroutine is running. GUARDED_BY(mu)
	refreshDue time.Duration
	refreshing bool
	// released is set once Release (or Close) began. GUARDED_BY(mu)
	released bool
	// lostErr wraps lockmgr.ErrLeaseLost once the lease is lost.
	// INVARIANT: lostErr != nil iff lostc is closed. GUARDED_BY(mu)
	lostErr error
}

// newLease makes the lease for a claim whose write landed. If the write
// took so long to resolve that most of its validity is gone, it refreshes
// at once.
func (b *Backend) newLease(ctx context.Context, id lockmgr.LockID, name, claim string, res landed) (*lease, error) {
	e := res.snap.rec.find(claim)
	if e == nil || !res.wrote {
		return nil, fmt.Errorf("internal error: claim %s landed without its entry", claim)
	}
	l := &lease{
		b: b, id: id, name: name, claim: claim,
		lostc: make(chan struct{}), wsem: make(chan struct{}, 1),
		mode: e.mode(), seq: e.Seq, epoch: e.Epoch, snap: res.snap,
		lastSent: res.sentAt, validUntil: res.sentAt + b.cfg.vouch(),
		refreshDue: res.sentAt + b.cfg.RefreshInterval,
	}
	if b.clock.Now() >= res.sentAt+b.cfg.vouch()/2 {
		if err := l.update(ctx, updateOpts{unbounded: true}); err != nil {
			b.abandon(name, claim, 0)
			return nil, err
		}
	}
	return l, nil
}

// Mode returns the claim's mode, or 0 once lost or released.
func (l *lease) Mode() lockmgr.Mode {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checkLocked(l.b.clock.Now())
	return l.mode
}

// Done returns a channel closed when the lease is lost: no refresh landed
// within TTL-Margin of the last one sent, or another host removed the claim.
func (l *lease) Done() <-chan struct{} { return l.lostc }

// Err returns why the lease was lost (wrapping lockmgr.ErrLeaseLost), or
// nil. It checks the validity on the clock, so a lease whose refresher could
// not run (the host was suspended, say) reads as lost as soon as it is.
func (l *lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checkLocked(l.b.clock.Now())
	return l.lostErr
}

// Describe shows the lease in status output, e.g.
// "gcs exclusive seq=12 epoch=4 valid 21.3s".
func (l *lease) Describe() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.b.clock.Now()
	l.checkLocked(now)
	switch {
	case l.lostErr != nil:
		return "gcs lost: " + l.lostErr.Error()
	case l.released:
		return "gcs released"
	}
	return fmt.Sprintf("gcs %s seq=%d epoch=%d valid %.1fs", l.mode, l.seq, l.epoch, (l.validUntil - now).Seconds())
}

// checkLocked marks the lease lost if its validity has ended.
func (l *lease) checkLocked(now time.Duration) {
	if l.lostErr == nil && !l.released && now >= l.validUntil {
		l.loseLocked(fmt.Errorf("no refresh landed within %v (TTL - margin) of the last one sent", l.b.cfg.vouch()))
	}
}

// loseLocked marks the lease lost, once.
func (l *lease) loseLocked(cause error) {
	if l.lostErr != nil || l.released {
		return
	}
	l.lostErr = fmt.Errorf("%s: %w: %w", l.id, lockmgr.ErrLeaseLost, cause)
	l.mode = 0
	close(l.lostc)
	l.b.stats.losses.Add(1)
	l.b.log.WithError(cause).WithFields(logrus.Fields{"lock": l.id.String(), "claim": l.claim}).
		Warn("lease lost")
}

func (l *lease) lose(cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.loseLocked(cause)
}

// state returns the lease's error if it cannot be used: lost, or released.
func (l *lease) usable() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checkLocked(l.b.clock.Now())
	switch {
	case l.lostErr != nil:
		return l.lostErr
	case l.released:
		return fmt.Errorf("%s: %w", l.id, lockmgr.ErrNotHeld)
	}
	return nil
}

// Convert changes the claim's mode. A downgrade is one write. An upgrade
// reads the object, and writes the claim exclusive (with a new epoch) when
// no live claim of another host conflicts; otherwise it fails with
// lockmgr.ErrWouldBlock, or with wait polls like Claim, keeping the shared
// claim refreshed meanwhile. If the claim is gone, the lease is lost and
// Convert returns an error wrapping lockmgr.ErrLeaseLost.
func (l *lease) Convert(ctx context.Context, mode lockmgr.Mode, wait bool) error {
	if err := l.convert(ctx, mode, wait); err != nil {
		return fmt.Errorf("convert %s to %s: %w", l.id, mode, err)
	}
	l.b.stats.conversions.Add(1)
	return nil
}

func (l *lease) convert(ctx context.Context, mode lockmgr.Mode, wait bool) error {
	if mode != lockmgr.Shared && mode != lockmgr.Exclusive {
		return fmt.Errorf("%w: mode %v", lockmgr.ErrInvalid, mode)
	}
	if err := l.b.enter(); err != nil {
		return err
	}
	defer l.b.inflight.Done()
	ctx, cancel := l.b.withClose(ctx)
	defer cancel()
	if err := l.usable(); err != nil {
		return err
	}
	if l.Mode() == mode {
		return nil
	}
	if mode == lockmgr.Shared {
		return l.update(ctx, updateOpts{change: func(rec *record, e *entry) { e.Mode = modeName(lockmgr.Shared) }})
	}
	defer l.setUpgrading(false)
	poll := l.b.newPoll()
	lastGen := int64(-1)
	marked := false
	for {
		err := l.update(ctx, updateOpts{judge: lockmgr.Exclusive, change: func(rec *record, e *entry) {
			rec.Epoch++
			e.Epoch = rec.Epoch
			e.Mode = modeName(lockmgr.Exclusive)
			e.Upgrading = false
		}})
		var blocked *errBlocked
		if !errors.As(err, &blocked) {
			return err
		}
		if !wait {
			return lockmgr.ErrWouldBlock
		}
		if !marked {
			// Say that we wait to upgrade, so that another host doing the
			// same sees the deadlock.
			l.setUpgrading(true)
			if err := l.update(ctx, updateOpts{}); err != nil {
				return err
			}
			marked = true
			continue
		}
		if rival := l.outranked(blocked.v.blockers); rival != nil {
			return fmt.Errorf("%w: host %q, holding %s shared too, waits to upgrade and has the older claim",
				lockmgr.ErrDeadlock, rival.Host, l.id)
		}
		if blocked.gen != lastGen {
			poll.reset()
			lastGen = blocked.gen
		}
		d := poll.next()
		if at := blocked.v.nextStale; at != 0 {
			d = min(d, max(at-l.b.clock.Now(), time.Millisecond))
		}
		if err := l.b.sleep(ctx, d); err != nil {
			return err
		}
	}
}

func (l *lease) setUpgrading(on bool) {
	l.mu.Lock()
	l.upgrading = on
	l.mu.Unlock()
}

// outranked returns a blocker that also holds the lock shared, also waits
// to upgrade, and has priority over this claim: waiting for it would be a
// deadlock that this claim must break by giving way. Nil if there is none.
func (l *lease) outranked(blockers []entry) *entry {
	l.mu.Lock()
	self := entry{Claim: l.claim, Epoch: l.epoch}
	l.mu.Unlock()
	for i := range blockers {
		b := &blockers[i]
		if b.Upgrading && b.mode() == lockmgr.Shared && b.outranks(&self) {
			return b
		}
	}
	return nil
}

// NextToken returns the next fencing token: the claim's epoch shifted left
// by 20 bits, or'ed with a counter of this host's grants under the claim.
// It makes no request, except once per 2^20-1 tokens, when it writes the
// claim with a new epoch.
func (l *lease) NextToken(ctx context.Context) (uint64, error) {
	for {
		if err := l.usable(); err != nil {
			return 0, fmt.Errorf("next token: %w", err)
		}
		l.mu.Lock()
		if l.tokens < maxLocalTokens {
			l.tokens++
			tok := l.epoch<<tokenBits | l.tokens
			l.mu.Unlock()
			return tok, nil
		}
		l.mu.Unlock()
		if err := l.b.enter(); err != nil {
			return 0, fmt.Errorf("next token: %w", err)
		}
		err := l.update(ctx, updateOpts{change: func(rec *record, e *entry) {
			rec.Epoch++
			e.Epoch = rec.Epoch
		}})
		l.b.inflight.Done()
		if err != nil {
			return 0, fmt.Errorf("next token %s: new epoch: %w", l.id, err)
		}
	}
}

// Release removes the claim from the lock object: one conditional write.
// It also tries on a lost lease, whose entry may still be there. After Close
// it returns nil (Close released the claim).
func (l *lease) Release(ctx context.Context) error {
	if err := l.b.enter(); err != nil {
		return nil
	}
	defer l.b.inflight.Done()
	if err := l.release(ctx); err != nil {
		return fmt.Errorf("release %s: %w", l.id, err)
	}
	return nil
}

func (l *lease) release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.released = true
	if l.lostErr == nil {
		l.mode = 0
	}
	l.mu.Unlock()
	l.b.forget(l)
	if err := l.acquire(ctx, false); err != nil {
		return err
	}
	defer l.releaseSem()
	err := l.write(ctx, func(cur snapshot) (*record, error) {
		if cur.rec.find(l.claim) == nil {
			return nil, errNoChange
		}
		rec := cur.rec.clone("")
		rec.Holders = rec.without(map[string]bool{l.claim: true})
		return rec, nil
	}, func(r *record) bool { return r.find(l.claim) == nil }, 0, false)
	if err != nil {
		return err
	}
	l.b.stats.releases.Add(1)
	return nil
}

// refreshNow refreshes the claim, waiting for a write in flight.
func (l *lease) refreshNow(ctx context.Context) error {
	return l.update(ctx, updateOpts{})
}

// updateOpts describe a write of the claim's own entry.
type updateOpts struct {
	// judge, if not 0, is the mode the other claims are judged against
	// first: the write is refused with errBlocked if they conflict, and
	// removes the stale ones. The object is read first.
	judge lockmgr.Mode
	// change edits the record and the claim's entry (already with a new
	// Seq). Nil for a refresh.
	change func(rec *record, e *entry)
	// try: give up at once (returning errBusy) if another write of the claim
	// is in flight.
	try bool
	// unbounded: requests are not bounded by the lease's validity (for a
	// claim not yet handed out, whose validity may have run out while its
	// write was being resolved).
	unbounded bool
}

// errBusy: another write of the claim is in flight.
var errBusy = errors.New("another write of the claim is in flight")

// update writes the claim's entry with a new Seq, changed by o.change. On
// success the lease's validity restarts from the write's send; if the entry
// is gone, the lease is lost.
func (l *lease) update(ctx context.Context, o updateOpts) error {
	if err := l.acquire(ctx, o.try); err != nil {
		return err
	}
	defer l.releaseSem()
	l.mu.Lock()
	if err := l.lostErr; err != nil {
		l.mu.Unlock()
		return err
	}
	if l.released {
		l.mu.Unlock()
		return fmt.Errorf("%s: %w", l.id, lockmgr.ErrNotHeld)
	}
	mode, epoch, seq, until, upgrading := l.mode, l.epoch, l.seq+1, l.validUntil, l.upgrading
	l.mu.Unlock()
	if o.unbounded {
		until = 0
	}
	err := l.write(ctx, func(cur snapshot) (*record, error) {
		rec := cur.rec.clone("")
		if o.judge != 0 {
			v := l.b.judge(l.name, cur.rec, o.judge, l.claim, l.b.clock.Now())
			if len(v.blockers) > 0 {
				return nil, &errBlocked{v: v, gen: cur.gen}
			}
			rec.Holders = rec.without(v.removable)
		}
		e := rec.find(l.claim)
		if e == nil {
			return nil, errGone
		}
		// Write the claim as this lease holds it: an upgrade abandoned
		// in flight may have landed, and is undone here.
		e.Seq, e.Mode, e.Epoch, e.Upgrading = seq, modeName(mode), epoch, upgrading
		e.Refreshed = l.b.wallNow()
		if o.change != nil {
			o.change(rec, e)
		}
		return rec, nil
	}, func(r *record) bool {
		e := r.find(l.claim)
		return e != nil && e.Seq >= seq
	}, until, o.judge != 0)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errGone):
		l.lose(errGone)
		return l.Err()
	case errors.Is(err, errExpired):
		l.mu.Lock()
		l.checkLocked(l.b.clock.Now())
		l.mu.Unlock()
		return l.Err()
	}
	return err
}

// acquire takes wsem, or fails with errBusy (try) or when ctx ends.
func (l *lease) acquire(ctx context.Context, try bool) error {
	if try {
		select {
		case l.wsem <- struct{}{}:
			return nil
		default:
			return errBusy
		}
	}
	select {
	case l.wsem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *lease) releaseSem() { <-l.wsem }

// write runs one mutation of the claim; the caller holds wsem. When it
// lands, the landed version becomes the lease's base, the lease takes the
// mode and epoch of its entry, and its validity restarts from the write's
// send. until bounds every request (0: none); fresh reads the object first
// instead of starting from the lease's last version.
func (l *lease) write(ctx context.Context, ed edit, eff effect, until time.Duration, fresh bool) error {
	l.mu.Lock()
	base := l.snap
	l.mu.Unlock()
	o := mutateOpts{until: until}
	if !fresh {
		o.base = &base
	}
	res, err := l.b.mutate(ctx, l.name, o, ed, eff)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.snap = res.snap
	if !res.wrote || l.lostErr != nil || l.released {
		return nil
	}
	e := res.snap.rec.find(l.claim)
	if e == nil {
		return nil
	}
	l.seq = max(l.seq, e.Seq)
	l.mode = e.mode()
	if e.Epoch != l.epoch {
		l.epoch, l.tokens = e.Epoch, 0
	}
	if res.sentAt >= l.lastSent {
		l.lastSent = res.sentAt
		l.validUntil = res.sentAt + l.b.cfg.vouch()
		l.refreshDue = res.sentAt + l.b.cfg.RefreshInterval
	}
	return nil
}
