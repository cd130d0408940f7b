package gcsbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/storage"
	"github.com/sirupsen/logrus"
	raw "google.golang.org/api/storage/v1"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/internal/logs"
	"github.com/lockfs/lockfs/internal/sessioncfg"
	"github.com/lockfs/lockfs/internal/stopctx"
	"github.com/lockfs/lockfs/lockmgr"
)

// Compile-time checks.
var (
	_ lockmgr.HierarchicalBackend = (*Backend)(nil)
	_ lockmgr.Lease               = (*lease)(nil)
	_ lockmgr.LeaseDescriber      = (*lease)(nil)
	_ lockmgr.ClaimLister         = (*Backend)(nil)
	_ lockmgr.ContendedLease      = (*lease)(nil)
)

// noWaitGiveUp bounds a claim without wait, whatever GCS does.
const noWaitGiveUp = 3 * time.Second

// errBackendClosed is returned by calls made after (or interrupted by) Close.
var errBackendClosed = fmt.Errorf("gcs backend: %w", lockmgr.ErrClosed)

// Backend is the gcs lockmgr.Backend: each host's claim on a lock is a
// record of its session in the lock's object in a GCS bucket; one
// heartbeat per host keeps them all alive. It is safe for concurrent use.
//
// LOCK ORDERING: a record's slot (ownRec.lock), then Backend.mu, then
// session.mu or lease.mu, then observations.mu. No mutex is held across a
// request, a sleep or a channel wait; a record's slot is, and serialises
// the writes of one record.
type Backend struct {
	// Dependencies
	client *storage.Client
	// conns is the connection pool of client and objects (conns.go).
	conns  *conns
	bucket *storage.BucketHandle
	// objects sends the requests of every claim (the read of an object's
	// content, the upload of its next version, the listing below a
	// directory) through the JSON API's generated client, under the
	// storage client: about a third less garbage each (store.go).
	objects *raw.ObjectsService
	log     logrus.FieldLogger
	clock   Clock

	// Constant data
	cfg Config // with defaults
	// unsafeWallExpiry is a test hook: judge expiry by comparing wall
	// clocks, the broken design that the clock-offset tests must catch.
	unsafeWallExpiry bool
	// noVerify is a test hook: grant a claim once its record is written,
	// without reading the hierarchy: the broken design the model-checked
	// history must catch.
	noVerify bool
	// listLegacyLong is a test hook: every exclusive directory claim also
	// lists all of PREFIX/locks-long/, as the layout before longBase did.
	listLegacyLong bool

	// closeCtx is cancelled when Close begins: it ends waits and the
	// background loops.
	closeCtx    context.Context
	closeCancel context.CancelFunc

	stats  counters
	obs    *observations
	wantID atomic.Uint64 // want object counter
	// paused stops heartbeats (test hook: a host whose heartbeats stall).
	paused atomic.Bool
	// crashed: Close leaves everything in the bucket (test hook).
	crashed atomic.Bool
	// pollWants lists the wants by the poll of before bells (test hook:
	// the control of the want path's cost).
	pollWants atomic.Bool

	// startSem serialises the start of a session (capacity 1).
	startSem chan struct{}
	// kick wakes the heartbeater (capacity 1).
	kick chan struct{}

	// Mutable state
	mu sync.Mutex
	// closed is set once Close began. GUARDED_BY(mu)
	closed bool
	// sess is the live session; nil before the first claim and after a
	// loss. GUARDED_BY(mu)
	sess *session
	// recs are the records of this host in lock objects, held or warm, by
	// object name. GUARDED_BY(mu)
	recs map[string]*ownRec
	// unleased holds every record of recs whose lease is nil (warm, or
	// not claimed yet), and maybe records that have left recs or got a
	// lease since: dropIdle looks only here and forgets those. So its
	// poll costs the records not in use, not every record held (a host
	// holding 100,000 locks would walk them all every WantPoll, with mu
	// held). GUARDED_BY(mu)
	unleased map[*ownRec]struct{}
	// layoutLogged: objects of a foreign layout already logged. GUARDED_BY(mu)
	layoutLogged map[string]bool
	// wants are the wants addressed to this session at the last listing.
	// GUARDED_BY(mu)
	wants []want
	// wantsListed is when they were listed. GUARDED_BY(mu)
	wantsListed time.Duration
	// waiterChecked is when the session of a waiter with a want here was
	// last judged. GUARDED_BY(mu)
	waiterChecked map[string]time.Duration
	// inflight counts API calls in progress. Add only under mu while !closed.
	inflight sync.WaitGroup
	// workers counts the heartbeater, the want poller and background drops.
	// Add only under mu while !closed, or from a worker.
	workers sync.WaitGroup
}

// New connects to the bucket and starts the backend's heartbeater and
// want poller. It makes no request: the session is started by the first
// claim.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	client, svc, conns, err := newClients(ctx, cfg)
	if err != nil {
		return nil, err
	}
	log := logs.OrDiscard(cfg.Logger)
	closeCtx, closeCancel := context.WithCancel(context.Background())
	b := &Backend{
		client:        client,
		conns:         conns,
		bucket:        client.Bucket(cfg.Bucket),
		objects:       svc.Objects,
		log:           log.WithFields(logrus.Fields{"backend": "gcs", "bucket": cfg.Bucket, "host": cfg.HostID}),
		clock:         cfg.Clock,
		cfg:           cfg,
		closeCtx:      closeCtx,
		closeCancel:   closeCancel,
		obs:           newObservations(),
		startSem:      make(chan struct{}, 1),
		kick:          make(chan struct{}, 1),
		recs:          make(map[string]*ownRec),
		unleased:      make(map[*ownRec]struct{}),
		layoutLogged:  make(map[string]bool),
		waiterChecked: make(map[string]time.Duration),
	}
	b.workers.Add(2)
	go b.heartbeater()
	go b.wantPoller()
	return b, nil
}

// ClaimsHierarchy says that a claim checks the ancestors (and, for an
// exclusive directory claim, everything below) itself: the engine asks for
// no ancestor claims.
func (b *Backend) ClaimsHierarchy() bool { return true }

// HostID returns the id this backend writes into its records.
func (b *Backend) HostID() string { return b.cfg.HostID }

// Config returns the backend's configuration, defaults filled in.
func (b *Backend) Config() Config { return b.cfg }

// Stats returns the request and event counts so far.
func (b *Backend) Stats() Stats { return b.stats.snapshot() }

// Claim takes this host's claim on id in mode: a record of this host's
// session in id's object, granted once no live record of another session
// conflicts with it there, on an ancestor's directory lock, or (for an
// exclusive directory claim) anywhere below. A record kept from an earlier
// claim is taken again with no request. Without wait a conflict gives
// lockmgr.ErrWouldBlock, and the call answers within 3s whatever GCS does
// (lockmgr.ErrUnavailable past that); with wait it polls with reads and
// asks the holders to give their records up, until granted or ctx ends.
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
	ctx, cancel := stopctx.With(ctx, b.closeCtx)
	defer cancel()
	giveUp := b.cfg.UnavailableAfter
	var bound context.Context
	if !wait {
		// flock -n answers within noWaitGiveUp, whatever GCS does.
		giveUp = min(giveUp, noWaitGiveUp)
		var stop context.CancelFunc
		bound, stop = context.WithTimeoutCause(ctx, giveUp, errNoWaitBound)
		defer stop()
		ctx = bound
	}
	l, err := b.claim(ctx, id, name, mode, wait, giveUp)
	if err != nil {
		switch {
		case b.closeCtx.Err() != nil && ctx.Err() != nil:
			return nil, errBackendClosed
		case bound != nil && context.Cause(bound) == errNoWaitBound:
			return nil, fmt.Errorf("%w: no answer from GCS within %v", lockmgr.ErrUnavailable, giveUp)
		}
		return nil, err
	}
	b.stats.claims.Add(1)
	return l, nil
}

// errNoWaitBound ends a claim without wait that GCS did not let finish in
// time.
var errNoWaitBound = errors.New("bound of a claim without wait")

// claim runs the claim protocol on id's record.
func (b *Backend) claim(ctx context.Context, id lockmgr.LockID, name string, mode lockmgr.Mode, wait bool, giveUp time.Duration) (*lease, error) {
	since := b.wallNow() // this host's place in the turns across hosts
	s, pre, err := b.sessionAndScan(ctx, id, name, mode, giveUp)
	if err != nil {
		return nil, err
	}
	// Another host's waiter asked for this lock (or one it conflicts
	// with): let it have its turn first.
	for w := b.deferTo(id, mode); w != nil; w = b.deferTo(id, mode) {
		if !b.wantStands(ctx, w) {
			continue
		}
		if !wait {
			return nil, lockmgr.ErrWouldBlock
		}
		if err := b.sleep(ctx, backoff.Jitter(b.cfg.WantPoll)); err != nil {
			return nil, err
		}
	}
	r, err := b.lockRecFor(ctx, name, id, s)
	if err != nil {
		return nil, err
	}
	defer r.unlock()
	if err := s.err(b.clock.Now()); err != nil {
		return nil, err
	}
	b.mu.Lock()
	// Only a record of the very mode is taken again as it is: an
	// exclusive record kept for a shared claim would keep other hosts'
	// shared claims out for nothing.
	warm := r.present && r.mode == mode && !r.wanted && r.lease == nil
	b.mu.Unlock()
	if warm {
		b.stats.warmClaims.Add(1)
		return b.newLease(r), nil
	}
	if err := b.acquireRec(ctx, r, mode, wait, giveUp, 0, pre, since); err != nil {
		b.mu.Lock()
		if !r.present && r.lease == nil && b.recs[name] == r {
			delete(b.recs, name)
		}
		b.mu.Unlock()
		return nil, err
	}
	return b.newLease(r), nil
}

// sessionAndScan returns the live session. A claim that must start one
// (the host's first, or the first after a lost session) scans at the same
// time, and returns that scan for the claim's first round: a round trip
// saved on the first claim of a mount. The record is written only after
// both, so no record of the session lands before the session object. A
// scan that failed is not returned; the claim scans again.
func (b *Backend) sessionAndScan(ctx context.Context, id lockmgr.LockID, name string, mode lockmgr.Mode, giveUp time.Duration) (*session, *scan, error) {
	if s := b.currentSession(); s != nil {
		return s, nil, nil
	}
	type scanned struct {
		sc  scan
		err error
	}
	done := make(chan scanned, 1)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// No record of a session not yet started can be in the way.
		sc, err := b.scanFor(sctx, id, name, mode, "", true)
		done <- scanned{sc, err}
	}()
	s, err := b.ensureSession(ctx, giveUp)
	if err != nil {
		cancel()
		<-done
		return nil, nil, err
	}
	res := <-done
	if res.err != nil {
		return s, nil, nil
	}
	return s, &res.sc, nil
}

// recFor returns this session's record handle for object name, creating it.
func (b *Backend) recFor(name string, id lockmgr.LockID, s *session) *ownRec {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.recs[name]
	if r == nil || r.sess != s {
		r = &ownRec{id: id, name: name, sess: s} // wantedBy: nil until wanted
		b.recs[name] = r
		b.unleased[r] = struct{}{}
	}
	return r
}

// lockRecFor returns this session's record handle for object name,
// holding its slot. The handle found may be dropped and forgotten (its
// record given back to a waiter of another host, or idle) while this call
// waits for its slot: a record then written through it would be unknown
// to this host, and no want could ever get it dropped. So a handle that
// left Backend.recs meanwhile is let go, and the current one taken.
func (b *Backend) lockRecFor(ctx context.Context, name string, id lockmgr.LockID, s *session) (*ownRec, error) {
	for {
		r := b.recFor(name, id, s)
		if err := r.lock(ctx); err != nil {
			return nil, err
		}
		b.mu.Lock()
		known := b.recs[name] == r
		b.mu.Unlock()
		if known {
			return r, nil
		}
		r.unlock()
	}
}

// wake makes the heartbeater look at the session again.
func (b *Backend) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// newWriteID returns a random write id.
func (b *Backend) newWriteID() string {
	return sessioncfg.RandomHex(8)
}

// wallNow is the wall clock, shifted by the test-only ClockOffset. It is
// written into records for people to read, and used as the first key of
// the priority between two claims (both sides compare the same values),
// never to judge expiry.
func (b *Backend) wallNow() time.Time {
	return time.Now().Add(b.cfg.ClockOffset).UTC().Truncate(time.Millisecond)
}
