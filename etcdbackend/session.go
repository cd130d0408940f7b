package etcdbackend

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/lockfs/lockfs/internal/backoff"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// errExpired: no keep-alive was answered for the session's whole validity.
var errExpired = errors.New("etcd session lease: no keep-alive answered within its TTL")

// errRevoked: the server no longer knows the session's lease.
var errRevoked = errors.New("etcd session lease expired or was revoked on the server")

// session is one etcd lease of this host: every claim and want key of the
// host is bound to it. It is kept alive by its keeper; the host vouches
// for it until TTL-Margin after the send of the last keep-alive the server
// answered. A lost session is dead for good: the next claim starts a new
// one.
type session struct {
	// Constant data
	id  clientv3.LeaseID
	sid string // the lease id in hex: the last element of its keys

	cancel context.CancelFunc // stops the keeper and the want watcher
	lostc  chan struct{}      // closed once the session is lost or stopped

	// Mutable state
	mu sync.Mutex
	// validUntil is when the host stops vouching, on Backend.clock.
	// GUARDED_BY(mu)
	validUntil time.Duration
	// err is why the session ended. INVARIANT: err != nil iff lostc is
	// closed. GUARDED_BY(mu)
	err error
}

// validity returns when the session stops being vouched for.
func (s *session) validity() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.validUntil
}

// extend moves the validity's end to until, if later.
func (s *session) extend(until time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if until > s.validUntil {
		s.validUntil = until
	}
}

// check returns why the session cannot be vouched for at now, or nil.
func (s *session) check(now time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if now >= s.validUntil {
		return errExpired
	}
	return nil
}

// end marks the session ended, once; it reports whether this call did.
func (s *session) end(cause error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return false
	}
	s.err = cause
	close(s.lostc)
	return true
}

// stop ends the session's goroutines (the caller waits for the workers).
func (s *session) stop() {
	s.end(errBackendClosed)
	s.cancel()
}

// session returns the live session, starting one if there is none.
func (b *Backend) session(ctx context.Context, giveUp time.Duration) (*session, error) {
	select {
	case b.startSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-b.startSem }()
	b.mu.Lock()
	s := b.sess
	b.mu.Unlock()
	if s != nil {
		if err := s.check(b.clock.Now()); err == nil {
			return s, nil
		} else {
			b.loseSession(s, err)
		}
	}
	return b.startSession(ctx, giveUp)
}

// startSession grants a new lease and starts its keeper and want watcher.
func (b *Backend) startSession(ctx context.Context, giveUp time.Duration) (*session, error) {
	var resp *clientv3.LeaseGrantResponse
	var sent time.Duration
	err := b.retry(ctx, giveUp, "grant the session lease", func(rctx context.Context) error {
		sent = b.clock.Now()
		var err error
		resp, err = b.cli.Grant(rctx, int64(b.cfg.leaseTTL()/time.Second))
		return err
	})
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(b.closeCtx)
	s := &session{
		id:         resp.ID,
		sid:        strconv.FormatInt(int64(resp.ID), 16),
		cancel:     cancel,
		lostc:      make(chan struct{}),
		validUntil: sent + b.cfg.vouch(time.Duration(resp.TTL)*time.Second),
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		cancel()
		rctx, rcancel := context.WithTimeout(context.Background(), closeTimeout)
		b.cli.Revoke(rctx, s.id)
		rcancel()
		return nil, errBackendClosed
	}
	b.sess = s
	b.workers.Add(2)
	b.mu.Unlock()
	b.stats.sessions.Add(1)
	go func() { defer b.workers.Done(); b.keep(sctx, s) }()
	go func() { defer b.workers.Done(); b.watchWants(sctx, s) }()
	b.log.WithField("session", s.sid).Info("etcd session started")
	return s, nil
}

// keep sends the session's keep-alives about every RefreshInterval, each
// bounded by the session's validity, and loses the session when the
// validity ends without one answered, or when the server says the lease
// is gone. It also drops warm claims idle for WarmFor.
func (b *Backend) keep(ctx context.Context, s *session) {
	bo := backoff.New(50*time.Millisecond, time.Second)
	next := b.cfg.RefreshInterval
	for {
		now := b.clock.Now()
		wait := min(next, s.validity()-now)
		tick, stop := b.clock.Timer(wait)
		select {
		case <-ctx.Done():
			stop()
			return
		case <-tick:
		}
		now = b.clock.Now()
		if err := s.check(now); err != nil {
			b.loseSession(s, err)
			return
		}
		b.dropIdle(s)
		rctx, cancel := context.WithTimeout(ctx, min(b.cfg.RequestTimeout, s.validity()-now))
		sent := b.clock.Now()
		resp, err := b.cli.KeepAliveOnce(rctx, s.id)
		cancel()
		b.stats.requests.Add(1)
		switch {
		case err == nil && resp.TTL > 0:
			s.extend(sent + b.cfg.vouch(time.Duration(resp.TTL)*time.Second))
			b.stats.keepAlives.Add(1)
			next = backoff.Jitter(b.cfg.RefreshInterval)
			bo.Reset()
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil:
			b.loseSession(s, errRevoked)
			return
		case ctx.Err() != nil:
			return
		default:
			b.log.WithError(err).WithField("session", s.sid).Warn("etcd keep-alive failed; retrying")
			next = bo.Next()
		}
	}
}

// loseSession ends s, if it is not ended yet: every lease of it is lost at
// once, its claims are forgotten, and the lease is revoked in the
// background once etcd answers, so that its keys go at once rather than at
// the server's expiry.
func (b *Backend) loseSession(s *session, cause error) {
	if !s.end(cause) {
		return
	}
	s.cancel()
	b.mu.Lock()
	if b.sess == s {
		b.sess = nil
	}
	var lost []*lease
	for id, c := range b.claims {
		if c.sess == s {
			delete(b.claims, id)
			c.gone = true
			if c.lease != nil {
				lost = append(lost, c.lease)
			}
		}
	}
	for k := range b.wants {
		delete(b.wants, k)
	}
	b.mu.Unlock()
	b.stats.sessionsLost.Add(1)
	b.log.WithError(cause).WithField("session", s.sid).Error("etcd session lost: every lock of this host is lost")
	for _, l := range lost {
		l.lose(cause)
	}
	b.goWorker(func() { b.revokeLost(s) })
}

// revokeLost revokes a lost session's lease, retrying for two TTLs (the
// server expires it by itself by then).
func (b *Backend) revokeLost(s *session) {
	bo := backoff.New(100*time.Millisecond, 2*time.Second)
	deadline := time.Now().Add(2 * b.cfg.TTL)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(b.closeCtx, b.cfg.RequestTimeout)
		_, err := b.cli.Revoke(ctx, s.id)
		cancel()
		b.stats.requests.Add(1)
		if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) || b.closeCtx.Err() != nil {
			return
		}
		if backoff.Sleep(b.closeCtx, nil, bo.Next(), nil) != nil {
			return
		}
	}
}
