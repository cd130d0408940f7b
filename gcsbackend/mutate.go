package gcsbackend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/lockmgr"
)

// Conditional writes and lost replies.
//
// Every change to a lock object is a read-modify-write: an edit computes the
// next record from the current version, and the upload is conditional on
// that version's generation. A 412 means another host wrote first: read
// again and edit again.
//
// When a write gets no definite answer (no reply, a reset, a timeout, 429,
// 5xx) it may or may not have landed, and it may even still land later.
// The writer then reads the object back:
//
//   - if the record shows the write's effect (its write id, or the claim as
//     written, or the claim gone for a release), the write landed: done;
//   - else, if the generation is still the one the write was conditional
//     on, nothing has landed yet: the very same bytes are sent again, with
//     the same condition and write id, so at most one of the copies can
//     land and either one is the intended write;
//   - else the object moved on without the write, which can therefore
//     never land: edit the new version.
//
// The lease's validity counts from the earliest send of the write that
// landed, since any copy may be the one that did.

// errNoChange is returned by an edit when the object is already as wanted.
var errNoChange = errors.New("no change needed")

// edit computes the record to write from the current version; it may
// return errNoChange, or an error that ends the mutation (errBlocked,
// errGone...). It must not modify cur.
type edit func(cur snapshot) (*record, error)

// effect reports whether a record shows that the write being resolved
// landed (besides carrying its write id).
type effect func(r *record) bool

// errBlocked is returned by a claim's edit when a live record of another
// session in the object conflicts.
type errBlocked struct {
	c   claimRef
	gen int64 // the generation judged
}

func (e *errBlocked) Error() string {
	return fmt.Sprintf("held by session %q", e.c.session)
}

// errAmbiguous is returned when the caller's context ended while a write's
// fate was unknown: it may still land.
type errAmbiguous struct {
	base int64 // the generation the write was conditional on
	err  error
}

func (e *errAmbiguous) Error() string {
	return fmt.Sprintf("gave up with a write in flight: %v", e.err)
}
func (e *errAmbiguous) Unwrap() error { return e.err }

// landed is the result of a successful mutation.
type landed struct {
	snap   snapshot      // the version that carries the write
	wrote  bool          // false if the edit said errNoChange
	sentAt time.Duration // earliest send of the write that landed, if wrote
}

// mutateOpts are the knobs of one mutation.
type mutateOpts struct {
	// base is the version to edit first, if known (from the lease's last
	// write); nil means read first.
	base *snapshot
	// until, if not 0, is a monotonic instant no request may outlive (the
	// end of the lease's validity).
	until time.Duration
	// giveUp, if not 0, replaces UnavailableAfter: how long GCS may fail
	// before the mutation fails with lockmgr.ErrUnavailable.
	giveUp time.Duration
}

// mutate applies ed to the object until a write lands, ed refuses, or ctx
// ends. See the comment at the top of this file.
func (b *Backend) mutate(ctx context.Context, name string, o mutateOpts, ed edit, eff effect) (landed, error) {
	w := &writer{b: b, name: name, o: o, eff: eff, fails: b.newFailClock(),
		bo: backoff.New(retryMin, retryMax), bo412: backoff.New(conflictMin, retryMax)}
	if o.giveUp != 0 {
		w.fails.limit = o.giveUp
	}
	var cur *snapshot
	if o.base != nil {
		c := *o.base
		cur = &c
	}
	for {
		if cur == nil {
			s, err := b.readRetry(ctx, name, o.until, w.fails)
			if err != nil {
				return landed{}, err
			}
			cur = &s
		}
		next, err := ed(*cur)
		if errors.Is(err, errNoChange) {
			return landed{snap: *cur}, nil
		}
		if err != nil {
			return landed{}, err
		}
		l, moved, err := w.send(ctx, cur.gen, next)
		if err != nil || moved == nil {
			return l, err
		}
		cur = moved // the object moved on without this write: edit again
	}
}

// writer is one mutation's state across its edits: where it writes, and
// the backoffs and failure clock every attempt shares.
type writer struct {
	b         *Backend
	name      string
	o         mutateOpts
	eff       effect
	fails     *failClock
	bo, bo412 *backoff.Backoff
}

// send writes next conditionally on generation base until it lands, the
// mutation fails, or the object moves on without it (moved: the version
// to edit again).
func (w *writer) send(ctx context.Context, base int64, next *record) (_ landed, moved *snapshot, _ error) {
	b := w.b
	next.Write = b.newWriteID()
	payload := next.encode()
	var firstSent time.Duration
	sentOnce := false
	for {
		if err := b.beforeWrite(ctx, w.o.until); err != nil {
			return landed{}, nil, err
		}
		if !sentOnce {
			firstSent, sentOnce = b.clock.Now(), true
		}
		rctx, cancel := b.requestCtx(ctx, w.o.until)
		gen, oc, err := b.write(rctx, w.name, base, payload, next.metadata())
		cancel()
		if oc == outcomeOK {
			return landed{snap: snapshot{gen: gen, rec: next}, wrote: true, sentAt: firstSent}, nil, nil
		}
		if err := w.afterMiss(ctx, oc, base, err); err != nil {
			return landed{}, nil, err
		}
		// Read back: did it land?
		s, err := b.readRetry(ctx, w.name, w.o.until, w.fails)
		if err != nil {
			if oc == outcomePrecondition {
				return landed{}, nil, err
			}
			return landed{}, nil, &errAmbiguous{base: base, err: err}
		}
		if s.rec != nil && (s.rec.Write == next.Write || (w.eff != nil && w.eff(s.rec))) {
			b.stats.recognised.Add(1)
			return landed{snap: s, wrote: true, sentAt: firstSent}, nil, nil
		}
		if s.gen != base {
			return landed{}, &s, nil
		}
		// Nothing landed yet: send the same write again.
	}
}

// afterMiss decides after a write that did not land with outcome oc: a
// permanent failure or an ended ctx ends the mutation (ambiguous if the
// write may still land); a transient failure or a 412 counts against the
// failure clock and backs off before the read-back.
func (w *writer) afterMiss(ctx context.Context, oc outcome, base int64, err error) error {
	b := w.b
	switch oc {
	case outcomePermanent:
		return fmt.Errorf("write %s: %w", w.name, err)
	case outcomeCanceled:
		b.stats.ambiguous.Add(1)
		return &errAmbiguous{base: base, err: ctx.Err()}
	case outcomeTransient:
		b.stats.ambiguous.Add(1)
		if err := w.fails.fail(err); err != nil {
			return &errAmbiguous{base: base, err: err}
		}
		if err := b.sleep(ctx, w.bo.Next()); err != nil {
			return &errAmbiguous{base: base, err: err}
		}
	case outcomePrecondition:
		// Another writer came first: back off too, and count it, so that
		// a stream of 412s (a misrouted endpoint, a hot object) neither
		// spins nor runs for ever.
		if err := w.fails.fail(fmt.Errorf("412: %w", err)); err != nil {
			return err
		}
		if err := b.sleep(ctx, w.bo412.Next()); err != nil {
			return err
		}
	}
	return nil
}

// readRetry reads the object, retrying transient failures with backoff
// until ctx ends or GCS has failed for UnavailableAfter.
func (b *Backend) readRetry(ctx context.Context, name string, until time.Duration, fails *failClock) (snapshot, error) {
	bo := backoff.New(retryMin, retryMax)
	for {
		if err := b.beforeWrite(ctx, until); err != nil {
			return snapshot{}, err
		}
		rctx, cancel := b.requestCtx(ctx, until)
		s, oc, err := b.read(rctx, name)
		cancel()
		switch oc {
		case outcomeOK:
			return s, nil
		case outcomeCanceled:
			return snapshot{}, ctx.Err()
		case outcomeTransient:
			if err := fails.fail(err); err != nil {
				return snapshot{}, err
			}
			if err := b.sleep(ctx, bo.Next()); err != nil {
				return snapshot{}, err
			}
		default:
			return snapshot{}, fmt.Errorf("read %s: %w", name, err)
		}
	}
}

// beforeWrite fails if ctx has ended or the instant until has passed.
func (b *Backend) beforeWrite(ctx context.Context, until time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if until != 0 && b.clock.Now() >= until {
		return errExpired
	}
	return nil
}

// errExpired: the lease's validity ended before the request could be sent.
var errExpired = errors.New("lease validity ended")

// failClock tracks how long one operation's requests have been failing
// (429, 5xx, no answer, 412) without a write landing.
type failClock struct {
	b     *Backend
	limit time.Duration // how long failures may last
	since time.Duration // first failure of the current run; 0 if none
}

func (b *Backend) newFailClock() *failClock {
	return &failClock{b: b, limit: b.cfg.UnavailableAfter}
}

// fail records a transient failure and returns an error wrapping
// lockmgr.ErrUnavailable once failures have lasted its limit.
func (f *failClock) fail(err error) error {
	now := f.b.clock.Now()
	if f.since == 0 {
		f.since = now
		return nil
	}
	if now-f.since >= f.limit {
		return fmt.Errorf("%w: GCS failing for %v: %v", lockmgr.ErrUnavailable, (now - f.since).Round(time.Millisecond), err)
	}
	return nil
}
