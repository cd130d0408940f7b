package gcsbackend

// The heartbeat: one conditional write of the session object every
// RefreshInterval, and the loss of the session when its validity ends.

import (
	"errors"
	"fmt"
	"time"

	"github.com/lockfs/lockfs/internal/backoff"
)

// heartbeater keeps the session alive: one conditional write every
// RefreshInterval (jittered), and the loss of the session when its
// validity ends.
func (b *Backend) heartbeater() {
	defer b.workers.Done()
	for {
		now := b.clock.Now()
		next := now + idleWake
		if s := b.currentSession(); s != nil {
			s.mu.Lock()
			due, until := s.refreshDue, s.validUntil
			s.mu.Unlock()
			if now >= due && !b.paused.Load() {
				if err := b.heartbeat(s); err != nil && b.closeCtx.Err() == nil {
					if s.err(b.clock.Now()) != nil || errors.Is(err, errSessionDead) {
						b.loseSession(s, err)
					} else {
						b.log.WithError(err).Warn("heartbeat failed; retrying")
						s.mu.Lock()
						s.refreshDue = b.clock.Now() + refreshRetry
						s.mu.Unlock()
					}
				}
				continue
			}
			next = min(due, until)
			if b.paused.Load() {
				next = until
			}
			next = min(next, now+wakeCheck)
		}
		c, stop := b.clock.Timer(max(next-now, time.Millisecond))
		select {
		case <-c:
		case <-b.kick:
		case <-b.closeCtx.Done():
			stop()
			return
		}
		stop()
	}
}

// heartbeat writes the next version of the session object, on condition of
// the last one's generation, resolving lost replies by reading back. Every
// request is bounded by the session's validity.
func (b *Backend) heartbeat(s *session) error {
	s.mu.Lock()
	doc := s.doc
	base := s.gen
	until := s.validUntil
	s.mu.Unlock()
	doc.Seq++
	doc.Refreshed = b.wallNow()
	doc.Write = b.newWriteID()
	bo := backoff.New(retryMin, retryMax)
	ctx := b.closeCtx
	first := time.Duration(-1)
	for {
		if err := b.beforeWrite(ctx, until); err != nil {
			return err
		}
		if first < 0 {
			first = b.clock.Now()
		}
		rctx, cancel := b.requestCtx(ctx, until)
		gen, oc, err := b.write(rctx, s.name, base, doc.encode(), doc.metadata())
		cancel()
		if oc == outcomeOK {
			b.landHeartbeat(s, doc, gen, first)
			return nil
		}
		if oc == outcomeCanceled {
			return ctx.Err()
		}
		if oc == outcomePermanent {
			return fmt.Errorf("heartbeat: %w", err)
		}
		if oc == outcomeTransient {
			b.stats.ambiguous.Add(1)
			if err := b.sleep(ctx, min(bo.Next(), max(until-b.clock.Now(), time.Millisecond))); err != nil {
				return err
			}
		}
		for {
			if err := b.beforeWrite(ctx, until); err != nil {
				return err
			}
			rctx, cancel := b.requestCtx(ctx, until)
			g, body, roc, rerr := b.readRaw(rctx, s.name)
			cancel()
			if roc == outcomeOK {
				var d *sessionDoc
				if g != 0 {
					d, _ = decodeSession(s.name, body)
				}
				switch {
				case d != nil && d.Write == doc.Write:
					b.stats.recognised.Add(1)
					b.landHeartbeat(s, doc, g, first)
					return nil
				case g == base:
				// nothing landed yet: send the same write again
				default:
					return errSessionDead
				}
				break
			}
			if roc == outcomeCanceled {
				return ctx.Err()
			}
			if roc == outcomePermanent {
				return fmt.Errorf("heartbeat read-back: %w", rerr)
			}
			if err := b.sleep(ctx, min(bo.Next(), max(until-b.clock.Now(), time.Millisecond))); err != nil {
				return err
			}
		}
	}
}

func (b *Backend) landHeartbeat(s *session, doc sessionDoc, gen int64, sent time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.doc, s.gen = doc, gen
	if sent >= s.lastSent {
		s.lastSent = sent
		s.validUntil = sent + b.cfg.vouch()
		s.refreshDue = sent + backoff.Jitter(b.cfg.RefreshInterval)
	}
	b.stats.refreshes.Add(1)
}
