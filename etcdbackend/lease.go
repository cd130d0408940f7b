package etcdbackend

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/internal/leaseend"
	"github.com/lockfs/lockfs/internal/stopctx"
	"github.com/lockfs/lockfs/lockmgr"
)

// Fencing tokens are rev<<tokenBits | n, where rev is the claim key's mod
// revision as this host last wrote it and n counts the grants this host
// made under it (a warm claim keeps counting).
const (
	tokenBits      = 20
	maxLocalTokens = 1<<tokenBits - 1
)

// lease is the engine's use of one of this host's claim keys. It is valid
// while the session is; it ends with Release (the key stays warm) or with
// the session's loss.
type lease struct {
	// Dependencies
	b *Backend
	c *ownClaim

	// Constant data
	sess *session
	// End is the lease's end: lost or released, and contended once
	// another host waits for the claim. It gives the lease Done and
	// Contended (each channel made when first asked for).
	leaseend.End
}

// newLeaseLocked makes the lease over c, whose key is in place. Called
// with b.mu held.
func (b *Backend) newLeaseLocked(c *ownClaim) *lease {
	l := &lease{b: b, c: c, sess: c.sess}
	c.lease = l
	if b.wantedLocked(c) {
		l.Contend()
	}
	return l
}

// Mode returns the claim's mode, or 0 once lost or released.
func (l *lease) Mode() lockmgr.Mode {
	if l.usable() != nil {
		return 0
	}
	l.b.mu.Lock()
	defer l.b.mu.Unlock()
	return l.c.mode
}

// Contended (leaseend.End) closes once another host waits for this claim
// (its want key was seen): the engine then gives the lease up after the
// holds running now.

// Err returns why the lease was lost (wrapping lockmgr.ErrLeaseLost), or
// nil. It checks the session's validity on the clock, so a lease whose
// keeper could not run reads as lost as soon as it is.
func (l *lease) Err() error {
	l.check()
	return l.Lost()
}

// check loses the session if its validity has ended.
func (l *lease) check() {
	if err := l.sess.check(l.b.clock.Now()); err != nil {
		l.b.loseSession(l.sess, err)
		l.lose(err)
	}
}

// lose marks the lease lost, once.
func (l *lease) lose(cause error) {
	lost, _ := l.Lose(l.c.id, cause)
	if lost == nil {
		return
	}
	l.b.stats.losses.Add(1)
	l.b.log.WithError(lost).WithField("lock", l.c.id.String()).Warn("lease lost")
}

// usable returns the lease's error if it cannot be used: lost, or released.
func (l *lease) usable() error {
	l.check()
	return l.Usable(l.c.id)
}

// Describe shows the lease in status output, e.g.
// "etcd exclusive rev=1234 session=694d7e5c2a1f0b03 valid 21.3s".
func (l *lease) Describe() string {
	l.check()
	lost, released := l.State()
	switch {
	case lost != nil:
		return "etcd lost: " + lost.Error()
	case released:
		return "etcd released"
	}
	l.b.mu.Lock()
	mode, rev := l.c.mode, l.c.rev
	l.b.mu.Unlock()
	return fmt.Sprintf("etcd %s rev=%d session=%s valid %.1fs", mode, rev, l.sess.sid, (l.sess.validity() - l.b.clock.Now()).Seconds())
}

// Convert changes the claim's mode: a downgrade is one write; an upgrade
// is a claim in exclusive mode over the key already there (which stays
// shared while it waits).
func (l *lease) Convert(ctx context.Context, mode lockmgr.Mode, wait bool) error {
	if err := l.convert(ctx, mode, wait); err != nil {
		return fmt.Errorf("convert %s to %s: %w", l.c.id, mode, err)
	}
	return nil
}

func (l *lease) convert(ctx context.Context, mode lockmgr.Mode, wait bool) error {
	if mode != lockmgr.Shared && mode != lockmgr.Exclusive {
		return fmt.Errorf("%w: mode %v", lockmgr.ErrInvalid, mode)
	}
	b := l.b
	if err := b.enter(); err != nil {
		return err
	}
	defer b.inflight.Done()
	callerCtx := ctx
	ctx, cancel, giveUp := b.bound(ctx, wait)
	defer cancel()
	if err := l.usable(); err != nil {
		return err
	}
	select {
	case l.c.slot <- struct{}{}:
	case <-ctx.Done():
		return b.ctxErr(callerCtx, ctx.Err())
	}
	defer l.c.unlock()
	if l.Mode() == mode {
		return nil
	}
	var rev int64
	var err error
	if mode == lockmgr.Shared {
		key := b.claimKey(l.c.id, l.sess.sid)
		err = b.retry(ctx, giveUp, "downgrade", func(rctx context.Context) error {
			resp, err := b.cli.Put(rctx, key, newRecord(b.cfg.HostID, mode), clientv3.WithLease(l.sess.id))
			if err == nil {
				rev = resp.Header.Revision
			}
			return err
		})
	} else {
		rev, err = b.acquire(ctx, l.c, l.sess, mode, wait, giveUp)
	}
	if err != nil {
		if lerr := l.Err(); lerr != nil {
			return lerr
		}
		return b.ctxErr(callerCtx, err)
	}
	b.mu.Lock()
	l.c.mode, l.c.rev, l.c.tokens = mode, rev, 0
	b.mu.Unlock()
	return nil
}

// NextToken returns the next fencing token: the claim key's revision
// shifted left by 20 bits, or'ed with a counter of this host's grants
// under it. It makes no request, except once per 2^20-1 tokens, when it
// rewrites the key for a new revision.
func (l *lease) NextToken(ctx context.Context) (uint64, error) {
	for {
		if err := l.usable(); err != nil {
			return 0, fmt.Errorf("next token: %w", err)
		}
		b := l.b
		b.mu.Lock()
		if l.c.tokens < maxLocalTokens {
			l.c.tokens++
			tok := uint64(l.c.rev)<<tokenBits | l.c.tokens
			b.mu.Unlock()
			return tok, nil
		}
		mode := l.c.mode
		b.mu.Unlock()
		key := b.claimKey(l.c.id, l.sess.sid)
		var rev int64
		err := b.retry(ctx, b.cfg.UnavailableAfter, "new token revision", func(rctx context.Context) error {
			resp, err := b.cli.Put(rctx, key, newRecord(b.cfg.HostID, mode), clientv3.WithLease(l.sess.id))
			if err == nil {
				rev = resp.Header.Revision
			}
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("next token %s: %w", l.c.id, err)
		}
		b.mu.Lock()
		if rev > l.c.rev {
			l.c.rev, l.c.tokens = rev, 0
		}
		b.mu.Unlock()
	}
}

// Release ends the lease. The key stays, warm, with no request, unless
// another host waits for it (now, or when Contended closed) or WarmFor is
// negative: then it is deleted
// (one request). A warm key is dropped once idle for WarmFor, or as soon
// as another host's want for it is seen.
func (l *lease) Release(ctx context.Context) error {
	first, lost := l.End.Release()
	if !first {
		return nil
	}
	b := l.b
	if err := b.enter(); err != nil {
		return nil // Close revokes the session, and every key with it
	}
	defer b.inflight.Done()
	c := l.c
	select {
	case c.slot <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("release %s: %w", c.id, ctx.Err())
	}
	defer c.unlock()
	now := b.clock.Now()
	b.mu.Lock()
	if c.lease == l {
		c.lease = nil
	}
	c.idleSince = now
	drop := !lost && !c.gone && (b.cfg.WarmFor < 0 || l.IsContended() || b.wantedLocked(c))
	b.mu.Unlock()
	b.stats.releases.Add(1)
	if !drop {
		return nil
	}
	ctx, cancel := stopctx.With(ctx, b.closeCtx)
	defer cancel()
	if err := b.dropKeyLocked(ctx, c, l.sess); err != nil {
		if errors.Is(err, context.Canceled) && b.closeCtx.Err() != nil {
			return nil
		}
		return fmt.Errorf("release %s: %w", c.id, err)
	}
	return nil
}
