package gcsbackend

// Closing: calls in flight, and Close, which releases every record and
// ends the session.

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// enter registers an API call in progress, or fails once Close has begun.
// The caller must call b.inflight.Done when it returns.
func (b *Backend) enter() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errBackendClosed
	}
	b.inflight.Add(1)
	return nil
}

// Close makes later calls fail with lockmgr.ErrClosed, ends the waits in
// progress and the background loops, drops every record of the session
// (one conditional write each, 32 at a time, each within
// UnavailableAfter), deletes the
// session object, waits for every goroutine of the backend and closes the
// client. A second call returns nil.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()

	b.closeCancel()
	b.inflight.Wait()
	b.workers.Wait()

	b.mu.Lock()
	s := b.sess
	var recs []*ownRec
	for _, r := range b.recs {
		if r.present && r.sess == s {
			recs = append(recs, r)
		}
		if r.lease != nil {
			r.lease.markReleased()
		}
	}
	b.mu.Unlock()

	var errs []error
	if s != nil && !b.crashed.Load() {
		var (
			wg  sync.WaitGroup
			emu sync.Mutex
			sem = make(chan struct{}, 32)
		)
		for _, r := range recs {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				ctx, cancel := context.WithTimeout(context.Background(), b.cfg.UnavailableAfter)
				defer cancel()
				if err := b.drop(ctx, r); err != nil {
					emu.Lock()
					errs = append(errs, fmt.Errorf("release %s: %w", r.id, err))
					emu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(errs) == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), b.cfg.UnavailableAfter)
			defer cancel()
			b.removeBell(ctx, s.id)
			if err := b.endSession(ctx, s); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := b.client.Close(); err != nil {
		errs = append(errs, err)
	}
	b.conns.close()
	return errors.Join(errs...)
}
