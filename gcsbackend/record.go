package gcsbackend

// A record's life after its claim: taken back (withdraw), dropped at once
// or later (drop, dropRec, dropLater), moved to another mode (setMode).

import (
	"context"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
)

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
	base := b.snapOfLocked(r)
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
	b.setSnapLocked(r, res.snap)
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
	base := b.snapOfLocked(r)
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
	b.setSnapLocked(r, res.snap)
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

// The version of its object a record remembers (the base of its next
// write, which saves a read) is nearly always the record's own claim
// alone: the write that granted it, or its release kept warm. That
// version is kept as four fields of the ownRec, and rebuilt when it is
// needed, instead of as the record (its claims and two strings, 180 bytes
// more per held lock). Any other version, and one that a rebuild would
// not give back field for field, is kept whole.

// snapOfLocked returns the version of r's object this host last read or
// wrote. Call with b.mu held.
func (b *Backend) snapOfLocked(r *ownRec) snapshot {
	if r.rec != nil || r.gen == 0 {
		return snapshot{gen: r.gen, rec: r.rec}
	}
	return snapshot{gen: r.gen, rec: b.ownOnly(r, r.ownMode, r.ownEpoch, r.ownSince)}
}

// setSnapLocked records s as the version of r's object this host last read
// or wrote. Call with b.mu held.
func (b *Backend) setSnapLocked(r *ownRec, s snapshot) {
	r.gen, r.rec = s.gen, s.rec
	if s.rec == nil || len(s.rec.Claims) != 1 {
		return
	}
	c := &s.rec.Claims[0]
	m, since := c.mode(), c.Since.UnixNano()
	// same compares the instants; a rebuild is in UTC, as wallNow writes.
	if c.Since.Location() != time.UTC || !b.ownOnly(r, m, c.Epoch, since).same(s.rec) {
		return
	}
	r.rec, r.ownMode, r.ownEpoch, r.ownSince = nil, m, c.Epoch, since
}

// ownOnly is the content of r's object when it holds r's claim alone, in
// mode with epoch, written at since (UnixNano). Its Write is empty: a
// write's id tells a read-back whether that write landed, and the next
// write gives its own.
func (b *Backend) ownOnly(r *ownRec, mode lockmgr.Mode, epoch uint64, since int64) *record {
	return &record{Version: layoutVersion, Lock: r.id.String(), Epoch: epoch,
		Claims: []claimRec{{Session: r.sess.id, Host: b.cfg.HostID, Mode: modeName(mode), Epoch: epoch, Since: time.Unix(0, since).UTC()}}}
}

// same reports whether r and o say the same, their write ids aside.
func (r *record) same(o *record) bool {
	if r.Version != o.Version || r.Lock != o.Lock || r.Epoch != o.Epoch || r.Next != nil || o.Next != nil || len(r.Claims) != len(o.Claims) {
		return false
	}
	for i := range r.Claims {
		a, c := &r.Claims[i], &o.Claims[i]
		if a.Session != c.Session || a.Host != c.Host || a.Mode != c.Mode || a.Epoch != c.Epoch || !a.Since.Equal(c.Since) {
			return false
		}
	}
	return true
}
