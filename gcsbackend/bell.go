package gcsbackend

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/lockfs/lockfs/internal/backoff"
)

// Bells: how a holder learns of a want with reads, not listings.
//
// Every session has a bell, the object PREFIX/bells/<session>. A waiter
// that has written a want to a holder rings the holder's bell: it reads the
// bell's generation g, then writes the bell on condition that it is still
// g (that it does not exist, for g = 0). Either its write lands, or a 412
// says that another write landed after its read, itself after the want was
// written: both are a change of the bell after the want was in place. A
// holder with records (held or warm) reads its bell's metadata once per
// WantPoll, and lists PREFIX/wants/<session>/ only when the generation
// changed since the read that preceded its last listing: a want is seen at
// the first listing after its ring, within about one WantPoll, and a host
// that nobody wants anything of reads one small object per poll and lists
// nothing. Many waiters ringing one bell at once cost one landed write and
// some 412s, which respects GCS's one write per second per object: a 412
// means that someone else rang for them.

// bellName is the bell object of session id.
func (b *Backend) bellName(id string) string {
	return b.cfg.Prefix + "bells/" + id
}

// bellDoc is the content of a bell, for people.
type bellDoc struct {
	Version int       `json:"v"`
	Waiter  string    `json:"waiter"`
	Host    string    `json:"host"`
	At      time.Time `json:"at"`
}

// ring rings the bell of session holder, after this host's want to it
// landed. It reports whether the bell changed after the call began
// (false: it could not tell, and the caller rings again later).
func (b *Backend) ring(ctx context.Context, self, holder string) bool {
	name := b.bellName(holder)
	body, _ := json.Marshal(bellDoc{Version: layoutVersion, Waiter: self, Host: b.cfg.HostID, At: b.wallNow()})
	meta := map[string]string{metaVersion: strconv.Itoa(layoutVersion)}
	bo := backoff.New(retryMin, retryMax)
	rctx, cancel := b.requestCtx(ctx, 0)
	gen, oc, _ := b.generation(rctx, name)
	cancel()
	if oc != outcomeOK {
		return false
	}
	for try := 0; try < 4; try++ {
		rctx, cancel := b.requestCtx(ctx, 0)
		_, oc, err := b.write(rctx, name, gen, body, meta)
		cancel()
		switch oc {
		case outcomeOK, outcomePrecondition:
			b.stats.rings.Add(1)
			return true
		case outcomeTransient:
			// 429 (someone rang within the second), 5xx or no answer: if
			// the generation moved, a write landed after the want.
			if b.sleep(ctx, bo.Next()) != nil {
				return false
			}
			rctx, cancel := b.requestCtx(ctx, 0)
			g, roc, _ := b.generation(rctx, name)
			cancel()
			if roc == outcomeOK && g != gen {
				b.stats.rings.Add(1)
				return true
			}
		default:
			b.log.WithError(err).WithField("bell", name).Debug("could not ring a holder's bell")
			return false
		}
	}
	return false
}

// bellRang reads the bell of s (one metadata read) and returns its
// generation and whether it changed since the read before s's last
// listing of wants; ok is false if the read failed (the next poll reads
// again).
func (b *Backend) bellRang(s *session) (gen int64, rang, ok bool) {
	ctx, cancel := b.requestCtx(b.closeCtx, 0)
	gen, oc, err := b.generation(ctx, b.bellName(s.id))
	cancel()
	if oc != outcomeOK {
		if b.closeCtx.Err() == nil {
			b.log.WithError(err).Debug("could not read this session's bell")
		}
		return 0, false, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return gen, gen != s.bellSeen, true
}

// removeBell deletes the bell of session id, if any (at a clean close, or
// once the session is declared dead). It is best effort: a bell left
// behind is a small object nobody reads.
func (b *Backend) removeBell(ctx context.Context, id string) {
	rctx, cancel := b.requestCtx(ctx, 0)
	defer cancel()
	if err := b.removeWant(rctx, b.bellName(id)); err != nil {
		b.log.WithError(err).WithField("session", id).Debug("could not delete a bell")
	}
}
