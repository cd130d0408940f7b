package gcsbackend

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/internal/sessioncfg"
	"github.com/lockfs/lockfs/lockmgr"
)

// Wants: how a waiter asks a holder.
//
// A waiter blocked by a record of another session creates the object
// PREFIX/wants/<holder session>/<waiter session>-<n>, naming in its
// metadata the lock object it wants the holder to give up, the lock and
// mode it waits for and when its wait began: its own object name, so that
// no two waiters write one object. It then rings the holder's bell
// (bell.go). A host with records, held or warm, reads its bell every
// WantPoll (jittered) and lists PREFIX/wants/<own session>/ when the bell
// changed: a warm record named there is dropped at once; a held one is
// dropped at its release, and its lease tells the engine (Contended) so
// that it stops handing the lock to local requests and releases it once
// the holds running finish. The waiter deletes its wants when its wait
// ends; a holder deletes the wants of waiters whose session it finds dead
// or gone, and lists again every RefreshInterval while it knows of wants,
// to learn that they are gone. So another host's waiter is noticed within
// about one WantPoll of asking, and a host that nobody asks anything of
// lists nothing.

const (
	metaWantObject = "lockfs-object" // the lock object the waiter wants
	metaWantWaiter = "lockfs-waiter" // the waiter's session
	metaWantLock   = "lockfs-lock"   // the lock the waiter waits for (LockID.String)
	metaWantMode   = "lockfs-mode"   // and in which mode
	metaWantSince  = "lockfs-since"  // when its wait began (wall clock, ms since the epoch)
	metaWantHost   = "lockfs-host"   // the waiter's host id
)

// want is a want addressed to this session, as the last listing showed it.
type want struct {
	name   string
	object string // the record the waiter wants this host to give up
	waiter string
	lock   lockmgr.LockID // what the waiter waits for
	mode   lockmgr.Mode
	host   string // the waiter's host, for people
	// since is when the waiter's wait began, on its wall clock: the order
	// of turns across hosts (as records' since, offsets only skew it).
	since int64
	// seen is when this host first listed the want.
	seen time.Duration
}

// deferLimit is how long a host defers its own claims to one want: a want
// left behind by a waiter whose delete failed must not hold a host back
// for ever.
func (c Config) deferLimit() time.Duration { return max(c.TTL, 10*c.WantPoll) }

// wantDoc is the content of a want object, for people.
type wantDoc struct {
	Version int       `json:"v"`
	Object  string    `json:"object"`
	Waiter  string    `json:"waiter"`
	Host    string    `json:"host"`
	Since   time.Time `json:"since"`
}

// asks are the wants of one wait, by holder session and object.
type asks struct {
	b     *Backend
	self  string
	id    lockmgr.LockID // the lock waited for
	mode  lockmgr.Mode
	since time.Time         // when the wait began
	names map[string]string // holder session + " " + object -> want object
	// unrung are the holder sessions that have a want of this wait whose
	// bell is not rung yet.
	unrung map[string]bool
}

func newAsks(b *Backend, self string, id lockmgr.LockID, mode lockmgr.Mode, since time.Time) *asks {
	return &asks{b: b, self: self, id: id, mode: mode, since: since, names: map[string]string{}, unrung: map[string]bool{}}
}

// ask creates a want for every session of cs not asked yet in this wait,
// and rings the bell of each session asked whose bell it has not rung
// yet. It is best effort: a want that cannot be written only means the
// holder keeps its record until it releases it (or, warm, until it is
// idle); a bell not rung is rung at the next call. Sessions known dead
// (records kept for their lock-delay) are not asked: nobody would answer.
func (a *asks) ask(ctx context.Context, cs []claimRef) {
	for _, c := range cs {
		key := c.session + " " + c.object
		if _, ok := a.names[key]; ok || c.turn || a.b.isDead(c.session) {
			continue
		}
		name := fmt.Sprintf("%swants/%s/%s-%d", a.b.cfg.Prefix, c.session, a.self, a.b.wantID.Add(1))
		doc := wantDoc{Version: layoutVersion, Object: c.object, Waiter: a.self, Host: a.b.cfg.HostID, Since: a.since}
		body, _ := json.Marshal(doc)
		meta := map[string]string{metaVersion: strconv.Itoa(layoutVersion), metaWantObject: c.object, metaWantWaiter: a.self,
			metaWantLock: a.id.String(), metaWantMode: modeName(a.mode), metaWantSince: strconv.FormatInt(a.since.UnixMilli(), 10),
			metaWantHost: a.b.cfg.HostID}
		rctx, cancel := a.b.requestCtx(ctx, 0)
		_, oc, err := a.b.write(rctx, name, 0, body, meta)
		cancel()
		if oc != outcomeOK && oc != outcomePrecondition {
			a.b.log.WithError(err).WithField("want", name).Debug("could not ask a holder")
			continue
		}
		a.names[key] = name
		a.unrung[c.session] = true
		a.b.stats.wantsSent.Add(1)
	}
	for holder := range a.unrung {
		if a.b.ring(ctx, a.self, holder) {
			delete(a.unrung, holder)
		}
	}
}

// withdraw deletes the wants of the wait.
func (a *asks) withdraw() {
	if len(a.names) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.b.cfg.UnavailableAfter)
	defer cancel()
	for _, name := range a.names {
		bo := backoff.New(retryMin, retryMax)
		for try := 0; ; try++ {
			rctx, rcancel := a.b.requestCtx(ctx, 0)
			err := a.b.removeWant(rctx, name)
			rcancel()
			if err == nil {
				break
			}
			if try == 4 || a.b.sleep(ctx, bo.Next()) != nil {
				a.b.log.WithError(err).WithField("want", name).
					Warn("could not delete a want; the holder defers to it for a while, then ignores it")
				break
			}
		}
	}
}

// removeWant deletes a want object, whatever its generation.
func (b *Backend) removeWant(ctx context.Context, name string) error {
	b.stats.deletes.Add(1)
	err := b.bucket.Object(name).Delete(ctx)
	if err != nil && !strings.Contains(err.Error(), "404") {
		return err
	}
	return nil
}

// deferTo returns a waiter of another host that asked this host for a
// record and waits for a lock that a claim of id in mode would conflict
// with, unless this host holds a record that waiter wants (it is ahead of
// the waiter then). A claim defers to it, so that a host that keeps taking
// a lock does not starve another host's waiter: nil if there is none.
func (b *Backend) deferTo(id lockmgr.LockID, mode lockmgr.Mode) *want {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.wants {
		w := &b.wants[i]
		if now-w.seen > b.cfg.deferLimit() || !hierConflict(id, mode, w.lock, w.mode) {
			continue
		}
		ahead := false
		for _, r := range b.recs {
			if r.present && r.lease != nil && r.wantedBy[w.waiter] {
				ahead = true
				break
			}
		}
		if !ahead {
			c := *w
			return &c
		}
	}
	return nil
}

// wantStands reads w's object (the listing it came from may be up to a
// want poll old): if the waiter has deleted it meanwhile, it is forgotten
// and false returned. A read that fails counts as standing.
func (b *Backend) wantStands(ctx context.Context, w *want) bool {
	rctx, cancel := b.requestCtx(ctx, 0)
	gen, _, oc, _ := b.readRaw(rctx, w.name)
	cancel()
	if oc != outcomeOK || gen != 0 {
		return true
	}
	b.mu.Lock()
	for i := range b.wants {
		if b.wants[i].name == w.name {
			b.wants = append(b.wants[:i:i], b.wants[i+1:]...)
			break
		}
	}
	b.mu.Unlock()
	return false
}

// hierConflict reports whether claims (a, am) and (c, cm) of two hosts
// conflict under the hierarchy: some lock is in both claims' cover (the
// lock itself in its mode, and the directory locks above it, shared) in
// conflicting modes. An exclusive directory lock covers what is inside it
// because everything inside covers it shared.
func hierConflict(a lockmgr.LockID, am lockmgr.Mode, c lockmgr.LockID, cm lockmgr.Mode) bool {
	cover := func(id lockmgr.LockID, m lockmgr.Mode) map[lockmgr.LockID]lockmgr.Mode {
		out := map[lockmgr.LockID]lockmgr.Mode{id: m}
		for _, p := range dirsAbove(id) {
			d := lockmgr.LockID{Path: p, Kind: lockmgr.KindDir}
			if out[d] == 0 {
				out[d] = lockmgr.Shared
			}
		}
		return out
	}
	ca := cover(a, am)
	for id, m := range cover(c, cm) {
		if ma, ok := ca[id]; ok && lockmgr.Conflicts(ma, m) {
			return true
		}
	}
	return false
}

// turnGrace is how long a claim lets another host's turn (record.Next) go
// first: the waiter named polls at least once a second, so it has had
// several chances to claim by then; past it, the waiter is taken to have
// given up.
func (c Config) turnGrace() time.Duration { return max(2*c.WantPoll, 2*pollMax) }

// nextTurn returns the turn to write when r's record is dropped: the
// waiter, among the wants for r's object that still stand (one read each,
// in order, until one does: the last listing may be a poll old), whose wait
// began first (then the lower session id); nil if nobody waits for it.
func (b *Backend) nextTurn(ctx context.Context, r *ownRec) *turn {
	b.mu.Lock()
	var cands []want
	if r.wanted {
		for _, w := range b.wants {
			if w.object == r.name && r.wantedBy[w.waiter] && !b.isDead(w.waiter) {
				cands = append(cands, w)
			}
		}
	}
	b.mu.Unlock()
	slices.SortFunc(cands, func(x, y want) int {
		if c := cmp.Compare(x.since, y.since); c != 0 {
			return c
		}
		return strings.Compare(x.waiter, y.waiter)
	})
	for i := range cands {
		w := &cands[i]
		if !b.wantStands(ctx, w) {
			continue
		}
		return &turn{Session: w.waiter, Host: w.host, Lock: w.lock.String(), Mode: modeName(w.mode),
			Since: w.since, Want: w.name, ID: sessioncfg.RandomHex(4)}
	}
	return nil
}

// turnInWay reports whether turn t, found in object obj, is in the way of
// a claim of id in mode: what its waiter waits for conflicts with the
// claim, its waiter is not known dead, and this host first saw it less
// than turnGrace ago. It returns the turn as a conflict.
func (b *Backend) turnInWay(ctx context.Context, obj string, t *turn, id lockmgr.LockID, mode lockmgr.Mode) (claimRef, bool) {
	tid, err := parseLockID(t.Lock)
	if err != nil || !hierConflict(id, mode, tid, parseMode(t.Mode)) || b.isDead(t.Session) {
		return claimRef{}, false
	}
	now := b.clock.Now()
	key := obj + "\x00" + t.ID
	b.obs.mu.Lock()
	first, ok := b.obs.turns[key]
	if !ok {
		first = now
		for k, at := range b.obs.turns {
			if now-at > 10*b.cfg.turnGrace() {
				delete(b.obs.turns, k)
			}
		}
		b.obs.turns[key] = first
	}
	b.obs.mu.Unlock()
	end := first + b.cfg.turnGrace()
	if now >= end || first < 0 {
		return claimRef{}, false
	}
	if t.Want != "" {
		// The turn stands while its waiter waits: its want is there. A
		// waiter that gave up (or a process that ended) deletes it.
		rctx, cancel := b.requestCtx(ctx, 0)
		gen, oc, _ := b.generation(rctx, t.Want)
		cancel()
		if oc == outcomeOK && gen == 0 {
			b.obs.mu.Lock()
			b.obs.turns[key] = -1 // gone for good
			b.obs.mu.Unlock()
			return claimRef{}, false
		}
	}
	return claimRef{object: obj, session: t.Session, host: t.Host, mode: parseMode(t.Mode), since: t.Since, turn: true, turnEnd: end}, true
}
