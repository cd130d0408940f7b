package gcsbackend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/storage"
	"github.com/sirupsen/logrus"
	"google.golang.org/api/option"

	"github.com/lockfs/lockfs/lockmgr"
)

// Compile-time checks.
var (
	_ lockmgr.Backend        = (*Backend)(nil)
	_ lockmgr.Lease          = (*lease)(nil)
	_ lockmgr.LeaseDescriber = (*lease)(nil)
)

// noWaitGiveUp bounds how long a claim without wait retries a failing GCS.
const noWaitGiveUp = 3 * time.Second

// errBackendClosed is returned by calls made after (or interrupted by) Close.
var errBackendClosed = fmt.Errorf("gcs backend: %w", lockmgr.ErrClosed)

// Backend is the gcs lockmgr.Backend: each host's claim on a lock is an
// entry in the lock's object in a GCS bucket, kept alive by refreshes. It is
// safe for concurrent use.
//
// LOCK ORDERING: Backend.mu before lease.mu before observations.mu. None is
// held across a request, a sleep or a channel wait; a lease's writes are
// serialised by its wsem channel instead.
type Backend struct {
	// Dependencies
	client *storage.Client
	bucket *storage.BucketHandle
	log    logrus.FieldLogger
	clock  Clock

	// Constant data
	cfg     Config // with defaults
	session string // random; every claim id of this backend starts with it and "."
	// unsafeWallExpiry is a test hook: judge expiry by comparing wall
	// clocks, the broken design that the clock-offset tests must catch.
	unsafeWallExpiry bool

	// closeCtx is cancelled when Close begins: it ends waits and the
	// refresher.
	closeCtx    context.Context
	closeCancel context.CancelFunc

	stats counters
	obs   *observations
	ids   atomic.Uint64 // claim and write id counter

	// Mutable state
	mu sync.Mutex
	// closed is set once Close began. GUARDED_BY(mu)
	closed bool
	// leases are the claims held and not yet released. GUARDED_BY(mu)
	leases map[*lease]struct{}
	// claims are the claim ids of this backend that a lease holds or a
	// Claim call is making; other claims of this session are orphans.
	// GUARDED_BY(mu)
	claims map[string]bool
	// kick wakes the refresher (capacity 1).
	kick chan struct{}
	// inflight counts API calls in progress. Add only under mu while !closed.
	inflight sync.WaitGroup
	// workers counts the refresher, its refresh goroutines and the clean-ups
	// of abandoned claims. Add only under mu while !closed, or from a worker.
	workers sync.WaitGroup
}

// New connects to the bucket and starts the backend's refresher. It makes no
// request: a bucket that does not exist or cannot be written shows up on the
// first claim.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	opts := []option.ClientOption{storage.WithJSONReads()}
	if cfg.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(cfg.Endpoint), option.WithoutAuthentication())
	} else if v := os.Getenv("STORAGE_EMULATOR_HOST"); v != "" {
		return nil, fmt.Errorf("gcsbackend: STORAGE_EMULATOR_HOST=%q is set: the GCS client would silently drop "+
			"authentication and talk to it; unset it, or name the emulator explicitly as the endpoint", v)
	}
	client, err := storage.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("gcsbackend: storage client: %w", err)
	}
	// Every retry is ours: counted, bounded by the lease, resolved by
	// reading back.
	client.SetRetry(storage.WithPolicy(storage.RetryNever))
	log := cfg.Logger
	if log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		log = l
	}
	closeCtx, closeCancel := context.WithCancel(context.Background())
	b := &Backend{
		client:      client,
		bucket:      client.Bucket(cfg.Bucket),
		log:         log.WithFields(logrus.Fields{"backend": "gcs", "bucket": cfg.Bucket, "host": cfg.HostID}),
		clock:       cfg.Clock,
		cfg:         cfg,
		session:     randomHex(8),
		closeCtx:    closeCtx,
		closeCancel: closeCancel,
		obs:         newObservations(),
		leases:      make(map[*lease]struct{}),
		claims:      make(map[string]bool),
		kick:        make(chan struct{}, 1),
	}
	b.workers.Add(1)
	go b.refresher()
	return b, nil
}

// HostID returns the id this backend writes into its claims.
func (b *Backend) HostID() string { return b.cfg.HostID }

// Config returns the backend's configuration, defaults filled in.
func (b *Backend) Config() Config { return b.cfg }

// Stats returns the request and event counts so far.
func (b *Backend) Stats() Stats { return b.stats.snapshot() }

// Claim takes this host's claim on id in mode. Without wait it fails with
// lockmgr.ErrWouldBlock if another host holds a live conflicting claim;
// with wait it polls the lock object with reads, with jittered backoff from
// 50ms to 1s, until the claim is granted or ctx ends. A claim of another
// host that this backend has seen unchanged for its stale period is removed
// by the granting write. If GCS keeps failing for UnavailableAfter (3s at
// most without wait), Claim fails with an error wrapping
// lockmgr.ErrUnavailable.
func (b *Backend) Claim(ctx context.Context, id lockmgr.LockID, mode lockmgr.Mode, wait bool) (lockmgr.Lease, error) {
	l, err := b.claimCall(ctx, id, mode, wait)
	if err != nil {
		return nil, fmt.Errorf("claim %s %s: %w", mode, id, err)
	}
	return l, nil
}

func (b *Backend) claimCall(ctx context.Context, id lockmgr.LockID, mode lockmgr.Mode, wait bool) (*lease, error) {
	if mode != lockmgr.Shared && mode != lockmgr.Exclusive {
		return nil, fmt.Errorf("%w: mode %v", lockmgr.ErrInvalid, mode)
	}
	name, err := objectName(b.cfg.Prefix, id)
	if err != nil {
		return nil, err
	}
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.inflight.Done()
	ctx, cancel := b.withClose(ctx)
	defer cancel()

	claim := b.newClaimID()
	b.mu.Lock()
	b.claims[claim] = true
	b.mu.Unlock()
	l, err := b.claim(ctx, id, name, claim, mode, wait)
	if err != nil {
		b.mu.Lock()
		delete(b.claims, claim)
		b.mu.Unlock()
		if b.closeCtx.Err() != nil && ctx.Err() != nil {
			return nil, errBackendClosed
		}
		return nil, err
	}
	b.mu.Lock()
	closed := b.closed
	if !closed {
		b.leases[l] = struct{}{}
	}
	b.mu.Unlock()
	if closed {
		rctx, cancel := context.WithTimeout(context.Background(), b.cfg.UnavailableAfter)
		l.release(rctx)
		cancel()
		return nil, errBackendClosed
	}
	b.stats.claims.Add(1)
	b.wake()
	return l, nil
}

// claim runs the claim protocol: read, judge, write; poll while blocked.
func (b *Backend) claim(ctx context.Context, id lockmgr.LockID, name, claim string, mode lockmgr.Mode, wait bool) (*lease, error) {
	poll := b.newPoll()
	lastGen := int64(-1)
	for {
		var takeovers int
		o := mutateOpts{}
		if !wait {
			// flock -n should not hang through an outage.
			o.giveUp = min(b.cfg.UnavailableAfter, noWaitGiveUp)
		}
		res, err := b.mutate(ctx, name, o, func(cur snapshot) (*record, error) {
			v := b.judge(name, cur.rec, mode, claim, b.clock.Now())
			if len(v.blockers) > 0 {
				return nil, &errBlocked{v: v, gen: cur.gen}
			}
			rec := cur.rec.clone(id.String())
			rec.Holders = rec.without(v.removable)
			takeovers = len(v.removable)
			rec.Epoch++
			wall := b.wallNow()
			rec.Holders = append(rec.Holders, entry{
				Claim: claim, Host: b.cfg.HostID, Mode: modeName(mode), Seq: 1, Epoch: rec.Epoch,
				TTLMillis: b.cfg.TTL.Milliseconds(), StaleMillis: b.cfg.staleAfter().Milliseconds(),
				Since: wall, Refreshed: wall,
			})
			return rec, nil
		}, func(r *record) bool { return r.find(claim) != nil })

		var blocked *errBlocked
		var amb *errAmbiguous
		switch {
		case err == nil:
			b.stats.takeovers.Add(uint64(takeovers))
			if takeovers > 0 {
				b.log.WithFields(logrus.Fields{"lock": id.String(), "claims": takeovers}).
					Info("removed stale claims of other hosts")
			}
			return b.newLease(ctx, id, name, claim, res)
		case errors.As(err, &blocked):
			if !wait {
				return nil, lockmgr.ErrWouldBlock
			}
			if blocked.gen != lastGen {
				poll.reset() // the object changed: it may change again soon
				lastGen = blocked.gen
			}
			d := poll.next()
			if at := blocked.v.nextStale; at != 0 {
				// Wake when the first blocker turns stale, not a poll later.
				d = min(d, max(at-b.clock.Now(), time.Millisecond))
			}
			if err := b.sleep(ctx, d); err != nil {
				return nil, err
			}
		case errors.As(err, &amb):
			b.abandon(name, claim, amb.base)
			return nil, err
		default:
			return nil, err
		}
	}
}

// abandon resolves a claim write whose caller gave up while it was in
// flight, in the background: if it landed, the claim is removed; if it may
// still land, the object is rewritten unchanged on the same condition, so
// that it never can. Meanwhile the claim id stays an orphan that this
// backend's own claims remove at once.
func (b *Backend) abandon(name, claim string, base int64) {
	// Called from a Claim in progress: Close has not begun waiting for
	// workers, and will wait for this one.
	b.workers.Add(1)
	go func() {
		defer b.workers.Done()
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.UnavailableAfter)
		defer cancel()
		_, err := b.mutate(ctx, name, mutateOpts{}, func(cur snapshot) (*record, error) {
			if cur.rec.find(claim) != nil {
				rec := cur.rec.clone("")
				rec.Holders = rec.without(map[string]bool{claim: true})
				return rec, nil
			}
			if cur.gen == base {
				return cur.rec.clone(""), nil // fence: the old write can no longer land
			}
			return nil, errNoChange
		}, func(r *record) bool { return r.find(claim) == nil })
		if err != nil {
			b.log.WithError(err).WithField("object", name).
				Warn("could not clean up an abandoned claim; it will expire after its TTL")
		}
	}()
}

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

// withClose returns ctx, also cancelled when Close begins.
func (b *Backend) withClose(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(b.closeCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

// Close makes later calls fail with lockmgr.ErrClosed, ends the waits in
// progress and the refresher, releases every claim still held (one
// conditional write each, within UnavailableAfter), waits for every
// goroutine of the backend and closes the client. A second call returns nil.
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
	leases := make([]*lease, 0, len(b.leases))
	for l := range b.leases {
		leases = append(leases, l)
	}
	b.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.UnavailableAfter)
	defer cancel()
	var (
		wg   sync.WaitGroup
		emu  sync.Mutex
		errs []error
		sem  = make(chan struct{}, 8)
	)
	for _, l := range leases {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			b.log.WithFields(logrus.Fields{"lock": l.id.String(), "mode": l.Mode().String()}).
				Info("releasing claim still held at close")
			if err := l.release(ctx); err != nil {
				emu.Lock()
				errs = append(errs, fmt.Errorf("release %s: %w", l.id, err))
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := b.client.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// forget drops a released or lost lease from the sets Close and the
// refresher walk.
func (b *Backend) forget(l *lease) {
	b.mu.Lock()
	delete(b.leases, l)
	delete(b.claims, l.claim)
	b.mu.Unlock()
}

// holdsClaim reports whether claim is held or being made by this backend.
func (b *Backend) holdsClaim(claim string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.claims[claim]
}

// wake makes the refresher look at the leases again.
func (b *Backend) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// newClaimID returns a claim id unique across hosts and time: the session
// (random), ".", and a counter.
func (b *Backend) newClaimID() string {
	return b.session + "." + strconv.FormatUint(b.ids.Add(1), 10)
}

// newWriteID returns a random write id.
func (b *Backend) newWriteID() string {
	return randomHex(8)
}

// wallNow is the wall clock, shifted by the test-only ClockOffset. It is
// written into entries for people to read, never used to decide.
func (b *Backend) wallNow() time.Time {
	return time.Now().Add(b.cfg.ClockOffset).UTC().Truncate(time.Millisecond)
}
