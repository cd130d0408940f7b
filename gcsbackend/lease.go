package gcsbackend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/internal/leaseend"
	"github.com/lockfs/lockfs/internal/stopctx"
	"github.com/lockfs/lockfs/lockmgr"
)

// Fencing tokens are epoch<<tokenBits | n, where epoch is the record's
// epoch from the lock object and n counts the grants this host made under
// it (a warm record keeps counting).
const (
	tokenBits      = 20
	maxLocalTokens = 1<<tokenBits - 1
)

// errGone: the record is no longer in the lock object.
var errGone = errors.New("this host's record was removed from the lock object by another host, which saw its session dead")

// lease is the engine's use of one of this host's records. It is valid
// while the session is; it ends with Release (the record stays warm) or
// with the session's loss.
type lease struct {
	// Dependencies
	b *Backend
	r *ownRec

	// End is the lease's end: lost or released (by Release or Close),
	// and contended once another host is known to wait for it. It gives
	// the lease Done and Contended (each channel made when first asked
	// for), and keeps OnLost's function.
	leaseend.End
}

// OnLost implements lockmgr.LossNotifier: f is called in a goroutine of
// its own when the lease is lost, so that the engine needs no goroutine
// per lease waiting on Done.
func (l *lease) OnLost(f func()) (stop func()) {
	lost, stop := l.End.OnLost(f)
	if lost {
		l.b.notify(f)
	}
	return stop
}

// notify runs f in a goroutine of its own, counted in workers unless the
// backend is closed (Close waits for the workers; a lease lost after
// Close still tells its engine). The caller holds neither b.mu nor a
// lease's mu.
func (b *Backend) notify(f func()) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		go f()
		return
	}
	b.workers.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.workers.Done()
		f()
	}()
}

// newLease makes the lease over r, whose record is in place.
func (b *Backend) newLease(r *ownRec) *lease {
	l := &lease{b: b, r: r}
	b.mu.Lock()
	r.lease = l
	wanted := r.wanted
	b.mu.Unlock()
	if wanted {
		// Asked for while this claim was being made: another host's
		// waiter is behind this grant.
		l.contend()
	}
	return l
}

// Contended (leaseend.End) closes once this host has learned that another
// host waits for the record (its want was listed, within about a WantPoll
// of its asking): the engine then stops handing the lock to local
// requests and releases it when the holds running end, and the record is
// dropped, not kept warm.

// contend marks the lease contended (closing Contended's channel), once.
func (l *lease) contend() {
	if !l.Contend() {
		return
	}
	l.b.stats.contended.Add(1)
	l.b.log.WithField("lock", l.r.id.String()).Debug("another host waits for a held lock: giving it up after the holds running")
}

// Mode returns the record's mode, or 0 once lost or released.
func (l *lease) Mode() lockmgr.Mode {
	if l.usable() != nil {
		return 0
	}
	l.b.mu.Lock()
	defer l.b.mu.Unlock()
	return l.r.mode
}

// Done (leaseend.End) closes when the lease is lost: the session lapsed or
// was declared dead, or the record was removed.

// Err returns why the lease was lost (wrapping lockmgr.ErrLeaseLost), or
// nil. It checks the session's validity on the clock, so a lease whose
// heartbeater could not run reads as lost as soon as it is.
func (l *lease) Err() error {
	l.check()
	return l.Lost()
}

// check loses the lease if its session's validity has ended.
func (l *lease) check() {
	if err := l.r.sess.err(l.b.clock.Now()); err != nil {
		l.b.loseSession(l.r.sess, err)
		l.lose(err)
	}
}

// Describe shows the lease in status output, e.g.
// "gcs exclusive epoch=4 session=web-1.8a2f... valid 21.3s".
func (l *lease) Describe() string {
	l.check()
	lost, released := l.State()
	switch {
	case lost != nil:
		return "gcs lost: " + lost.Error()
	case released:
		return "gcs released"
	}
	_, until := l.r.sess.validity()
	l.b.mu.Lock()
	mode, epoch := l.r.mode, l.r.epoch
	l.b.mu.Unlock()
	return fmt.Sprintf("gcs %s epoch=%d session=%s valid %.1fs", mode, epoch, l.r.sess.id, (until - l.b.clock.Now()).Seconds())
}

// lose marks the lease lost, once, and calls its OnLost function. The
// caller holds no lock of the backend's.
func (l *lease) lose(cause error) {
	lost, f := l.Lose(l.r.id, cause)
	if lost == nil {
		return
	}
	l.b.stats.losses.Add(1)
	l.b.log.WithError(lost).WithFields(logrus.Fields{"lock": l.r.id.String()}).Warn("lease lost")
	if f != nil {
		l.b.notify(f)
	}
}

func (l *lease) markReleased() { l.End.Release() }

// usable returns the lease's error if it cannot be used: lost, or released.
func (l *lease) usable() error {
	l.check()
	return l.Usable(l.r.id)
}

// Convert changes the record's mode. A downgrade is one write. An upgrade
// is a claim in exclusive mode on the record already there: it fails with
// lockmgr.ErrWouldBlock, or with wait polls, keeping the shared record
// meanwhile; two hosts upgrading the same lock see it, and the one
// without priority gives way with lockmgr.ErrDeadlock.
func (l *lease) Convert(ctx context.Context, mode lockmgr.Mode, wait bool) error {
	if err := l.convert(ctx, mode, wait); err != nil {
		return fmt.Errorf("convert %s to %s: %w", l.r.id, mode, err)
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
	ctx, cancel := stopctx.With(ctx, l.b.closeCtx)
	defer cancel()
	if err := l.usable(); err != nil {
		return err
	}
	if err := l.r.lock(ctx); err != nil {
		return err
	}
	defer l.r.unlock()
	cur := l.Mode()
	if cur == mode {
		return nil
	}
	var err error
	if mode == lockmgr.Shared {
		err = l.b.setMode(ctx, l.r, lockmgr.Shared)
	} else {
		giveUp := l.b.cfg.UnavailableAfter
		if !wait {
			giveUp = min(giveUp, noWaitGiveUp)
		}
		err = l.b.acquireRec(ctx, l.r, mode, wait, giveUp, cur, nil, l.b.wallNow())
	}
	if errors.Is(err, errGone) {
		l.lose(errGone)
		return l.Err()
	}
	return err
}

// NextToken returns the next fencing token: the record's epoch shifted
// left by 20 bits, or'ed with a counter of this host's grants under it. It
// makes no request, except once per 2^20-1 tokens, when it rewrites the
// record with a new epoch.
func (l *lease) NextToken(ctx context.Context) (uint64, error) {
	for {
		if err := l.usable(); err != nil {
			return 0, fmt.Errorf("next token: %w", err)
		}
		l.b.mu.Lock()
		if l.r.tokens < maxLocalTokens {
			l.r.tokens++
			tok := l.r.epoch<<tokenBits | l.r.tokens
			l.b.mu.Unlock()
			return tok, nil
		}
		cur := l.b.snapOfLocked(l.r)
		mode := l.r.mode
		l.b.mu.Unlock()
		if err := l.b.enter(); err != nil {
			return 0, fmt.Errorf("next token: %w", err)
		}
		err := l.r.lock(ctx)
		if err == nil {
			_, err = l.b.writeRec(ctx, l.r, cur, mode, l.b.cfg.UnavailableAfter)
			l.r.unlock()
		}
		l.b.inflight.Done()
		if err != nil {
			return 0, fmt.Errorf("next token %s: new epoch: %w", l.r.id, err)
		}
	}
}

// Release ends the lease. The record stays in the object, warm, with no
// request, unless another host asked for it: then it is dropped (one
// conditional write). A warm record is dropped once idle for WarmFor, or
// as soon as another host asks for it.
func (l *lease) Release(ctx context.Context) error {
	first, lost := l.End.Release()
	if !first {
		return nil
	}
	if err := l.b.enter(); err != nil {
		return nil // Close drops every record
	}
	defer l.b.inflight.Done()
	r := l.r
	if err := r.lock(ctx); err != nil {
		return fmt.Errorf("release %s: %w", r.id, err)
	}
	defer r.unlock()
	b := l.b
	b.mu.Lock()
	if r.lease == l {
		r.lease = nil
		b.unleased[r] = struct{}{}
	}
	r.idleSince = b.clock.Now()
	drop := r.wanted || b.cfg.WarmFor < 0
	if lost && b.recs[r.name] == r {
		delete(b.recs, r.name)
	}
	b.mu.Unlock()
	if lost || !drop {
		return nil
	}
	if err := b.dropLocked(ctx, r); err != nil {
		return fmt.Errorf("release %s: %w", r.id, err)
	}
	b.stats.wantsServed.Add(1)
	return nil
}

// ListClaims shows every host's claims on id from one read of its object:
// host, mode, since (the holder's wall clock), session and its state as
// this host judges it without further requests (live, stale: seen
// unchanged for its stale period, dead), and for this host's own record
// whether it is held or warm (another host's is "claimed": it keeps warm
// records without telling).
func (b *Backend) ListClaims(ctx context.Context, id lockmgr.LockID) ([]lockmgr.ClaimRecord, error) {
	name, err := objectName(b.cfg.Prefix, id)
	if err != nil {
		return nil, err
	}
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.inflight.Done()
	rctx, cancel := b.requestCtx(ctx, 0)
	s, _, err := b.read(rctx, name)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if s.rec == nil {
		return nil, nil
	}
	own := b.currentSession()
	now := b.clock.Now()
	var out []lockmgr.ClaimRecord
	for _, c := range s.rec.Claims {
		state, use := "live", "claimed"
		var delayUntil time.Time
		switch {
		case own != nil && c.Session == own.id:
			use = "warm"
			b.mu.Lock()
			if r := b.recs[name]; r != nil && r.sess == own && r.lease != nil {
				use = "held"
			}
			b.mu.Unlock()
		case b.isDead(c.Session):
			state = "dead"
			if until, _ := b.deadUntil(c.Session); until > now {
				// Rounded up to the second, as shown.
				delayUntil = time.Now().Add(until - now + time.Second - 1).Truncate(time.Second)
			}
		default:
			b.obs.mu.Lock()
			if seen, ok := b.obs.seen[c.Session]; ok && now >= seen.first+seen.stale {
				state = "stale"
			}
			b.obs.mu.Unlock()
		}
		out = append(out, lockmgr.ClaimRecord{Host: lockmgr.QuoteName(c.Host), Mode: c.mode(), Since: c.Since,
			Session: c.Session, State: state, Use: use, DelayUntil: delayUntil})
	}
	return out, nil
}
