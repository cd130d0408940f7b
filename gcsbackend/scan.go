package gcsbackend

// The hierarchy scan: what a claim reads before it writes and again to
// verify, its own object, its ancestors' and, for an exclusive directory
// lock, everything below it.

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/lockmgr"
)

// scan is what one round of reads found.
type scan struct {
	own       snapshot   // D's object (if read)
	conflicts []claimRef // records of other sessions that conflict, not known dead
}

// scanFor reads what a claim on id in mode must check; withOwn includes
// D's own object (whose conflicting records are also returned). Records of
// session self and of sessions known dead are left out.
func (b *Backend) scanFor(ctx context.Context, id lockmgr.LockID, name string, mode lockmgr.Mode, self string, withOwn bool) (scan, error) {
	sc := &scanner{b: b, ctx: ctx, id: id, mode: mode, self: self, withOwn: withOwn}
	if withOwn {
		sc.wg.Add(1)
		go sc.readObj(name, func(c *claimRec) bool { return lockmgr.Conflicts(mode, c.mode()) }, true)
	}
	if !b.noVerify {
		exclusiveOnly := func(c *claimRec) bool { return c.mode() == lockmgr.Exclusive }
		for _, a := range dirsAbove(id) {
			obj, err := objectName(b.cfg.Prefix, lockmgr.LockID{Path: a, Kind: lockmgr.KindDir})
			if err != nil {
				return scan{}, err
			}
			sc.wg.Add(1)
			go sc.readObj(obj, exclusiveOnly, false)
		}
		if id.Kind == lockmgr.KindDir && mode == lockmgr.Exclusive {
			sc.listInside(name)
		}
	}
	sc.wg.Wait()
	if len(sc.errs) > 0 {
		return scan{}, sc.errs[0]
	}
	return sc.out, nil
}

// scanner is one scanFor's reads, which run at once.
type scanner struct {
	b       *Backend
	ctx     context.Context
	id      lockmgr.LockID
	mode    lockmgr.Mode
	self    string
	withOwn bool

	wg   sync.WaitGroup
	mu   sync.Mutex
	out  scan    // GUARDED_BY(mu)
	errs []error // GUARDED_BY(mu)
}

// add records the conflicts cs one read found, or its error.
func (sc *scanner) add(cs []claimRef, err error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if err != nil {
		sc.errs = append(sc.errs, err)
		return
	}
	for _, c := range cs {
		if c.session != sc.self && !sc.b.isVoid(c.session) {
			sc.out.conflicts = append(sc.out.conflicts, c)
		}
	}
}

// readObj reads object obj and adds the records judge picks (and, in the
// claim's own object, a turn given to another session that is in the
// way); keep makes the object the scan's own.
func (sc *scanner) readObj(obj string, judge func(c *claimRec) bool, keep bool) {
	defer sc.wg.Done()
	s, err := sc.b.readRetry(sc.ctx, obj, 0, sc.b.newFailClock())
	if err != nil {
		sc.add(nil, err)
		return
	}
	if keep {
		sc.mu.Lock()
		sc.out.own = s
		sc.mu.Unlock()
	}
	var cs []claimRef
	if s.rec != nil {
		for i := range s.rec.Claims {
			if judge(&s.rec.Claims[i]) {
				cs = append(cs, s.rec.Claims[i].ref(obj))
			}
		}
		if t := s.rec.Next; sc.withOwn && t != nil && t.Session != sc.self {
			if c, ok := sc.b.turnInWay(sc.ctx, obj, t, sc.id, sc.mode); ok {
				cs = append(cs, c)
			}
		}
	}
	sc.add(cs, nil)
}

// listInside lists, at once, every record inside an exclusive directory
// claim's path: one listing of its prefix, long-named locks included
// (longBase), unless the path is so long that these are under an
// ancestor's.
func (sc *scanner) listInside(name string) {
	b, id := sc.b, sc.id
	sc.list(dirPrefix(b.cfg.Prefix, id.Path), name, nil)
	inPath := func(lock string) bool { return inside(id.Path, lock) }
	if b.listLegacyLong {
		// The test seam: the listing of every long-named lock that the
		// layout before longBase needed.
		sc.list(b.cfg.Prefix+"locks-long/", name, inPath)
	}
	if !fitsLongBase(b.cfg.Prefix, id.Path) {
		sc.list(longBase(b.cfg.Prefix, id.Path), name, inPath)
	}
}

// list adds, in the background, the records listBelow finds.
func (sc *scanner) list(prefix, skip string, keep func(lock string) bool) {
	sc.wg.Add(1)
	go func() {
		defer sc.wg.Done()
		sc.add(sc.b.listBelow(sc.ctx, prefix, skip, keep))
	}()
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
