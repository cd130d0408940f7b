package gcsbackend

// A record's life after its claim: taken back (withdraw), dropped at once
// or later (drop, dropRec, dropLater), moved to another mode (setMode).

import (
	"context"

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
