package lockmgr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// Config is what an Engine needs. Backend and Processes are required.
type Config struct {
	// Backend holds the host's claim on each lock (kernel flock, GCS lease).
	Backend Backend
	// Processes resolves thread ids to processes and their ancestors, for
	// the lineage rule and deadlock detection.
	Processes ProcessTree
	// Logger receives lease losses and backend errors that no caller can be
	// told about. Nil discards.
	Logger logrus.FieldLogger
	// Host names this daemon in status output. Default: os.Hostname().
	Host string
	// OnLoss, if set, is called for every hold that is marked lost (its
	// lease was lost, or an operator broke it), without engine locks held,
	// so that the caller can signal the holder (and what runs under it).
	OnLoss func(LostHold)
	// Now is the clock for "since" times. Default: time.Now.
	Now func() time.Time
	// Observer, if set, is told about every request and lost hold.
	Observer Observer
	// After is the clock of the self-deadlock grace (selfDeadlockGrace)
	// and of the scans for heirs made again (heirRescans): it returns a
	// channel that receives once d has passed. Default:
	// time.After. Tests inject a clock they advance by hand.
	After func(d time.Duration) <-chan time.Time
	// KeepContended makes the engine ignore ContendedLease: it keeps
	// handing a lease that someone outside waits for to local requests,
	// as lockfs did before it was fair across daemons (lease.go). It is
	// the control of the fairness tests, never for use.
	KeepContended bool
}

// Validate checks the required fields.
func (c *Config) Validate() error {
	if c.Backend == nil {
		return errors.New("lockmgr: Config.Backend is required")
	}
	if c.Processes == nil {
		return errors.New("lockmgr: Config.Processes is required")
	}
	return nil
}

// LostHold describes a hold that is no longer protected by its lease.
type LostHold struct {
	Lock   LockID
	Holder Holder
	Err    error
}

// Engine arbitrates the hierarchical lock protocol between the processes of
// one host and asks its Backend for the host's claim on each lock.
// It is safe for concurrent use.
//
// LOCK ORDERING: Engine.mu is the only mutex. It is never held across a
// Backend call that can wait (Claim, Convert, Release, NextToken), a /proc
// read, or a wait: queued waiters sleep on their own channel, others on the
// per-lock changed channel. Under mu the engine only asks leases for their
// Mode and Err, which answer from memory.
type Engine struct {
	// Dependencies
	backend Backend
	procs   ProcessTree
	// watcher is procs if it can watch exits (ProcessWatcher), else nil.
	watcher ProcessWatcher
	after   func(time.Duration) <-chan time.Time
	log     logrus.FieldLogger
	onLoss  func(LostHold)
	now     func() time.Time
	obs     Observer
	// yield runs after a Release that woke a waiter (runtime.Gosched).
	// The wake-up put the waiter's goroutine first in this thread's run
	// queue; yielding runs it here at once, so that it takes the lock and
	// its caller answers the waiting process before the releaser's own
	// answer goes out. Without it the Go scheduler wakes another thread to
	// steal the waiter, or leaves it until the releaser blocks: one more
	// thread wake-up per hand-off (docs/BENCHMARKS.md "Hand-off").
	yield func()

	// Constant data
	host string
	// tokenTimeout bounds the issuance of one deferred token at a status
	// read (tokenIssueTimeout; tests shorten it).
	tokenTimeout time.Duration
	// hier: the backend checks the hierarchy across hosts itself
	// (HierarchicalBackend), so implicit holds need no claim.
	hier bool
	// keepContended: Config.KeepContended.
	keepContended bool

	// Mutable state
	mu sync.Mutex
	// locks has an entry for every lock that is held, waited for, or has a
	// lease or a backend call in flight. GUARDED_BY(mu)
	locks map[LockID]*lockState
	// waiting maps a thread id to the step it is queued for, for deadlock
	// detection. A thread waits for one thing at a time. GUARDED_BY(mu)
	waiting map[int]*waiter
	// parked maps a thread id to what it sleeps on while it waits; a
	// waiter is quiescent while nothing it sleeps on has fired. Tests use
	// it to know when the engine has settled. GUARDED_BY(mu)
	parked map[int]parking
	// usage indexes the explicit usage holds, for the usage rule. GUARDED_BY(mu)
	usage map[*hold]struct{}
	// watches has one exit watch per process that a hold depends on
	// (heirs.go). GUARDED_BY(mu)
	watches map[ProcID]*procWatch
	// idle lists the watches that lost their last hold, oldest first, to
	// be ended after linger unless reused (heirs.go). GUARDED_BY(mu)
	idle []idleWatch
	// linger is how long an idle watch is kept: watchLinger (tests set 0
	// to end a watch with its last hold).
	linger time.Duration
	// exitWork counts exits being handled (mu may be dropped meanwhile
	// for a /proc scan), so that tests know when the engine has settled.
	// GUARDED_BY(mu)
	exitWork int
	// closed: no new locks are taken. GUARDED_BY(mu)
	closed bool
	// wakes counts the wake-ups sent to queued waiters, so that Release
	// knows whether it woke one (yield). GUARDED_BY(mu)
	wakes uint64
	// examined counts the waiters that wake-ups for holds looked at
	// (queue.go), for tests. GUARDED_BY(mu)
	examined uint64
	// grants numbers the grants of explicit holds, so that a deferred
	// token issued for one grant is never recorded for a later grant of
	// the same hold (tokens.go). GUARDED_BY(mu)
	grants uint64

	closing chan struct{}      // closed by Close, stops the lease watchers
	ctx     context.Context    // cancelled by Close: ends backend waits
	cancel  context.CancelFunc // cancels ctx
	wg      sync.WaitGroup     // lease watchers
}

// New returns an engine over cfg.Backend.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		backend: cfg.Backend,
		procs:   cfg.Processes,
		log:     cfg.Logger,
		onLoss:  cfg.OnLoss,
		now:     cfg.Now,
		obs:     cfg.Observer,
		yield:   runtime.Gosched,
		host:    cfg.Host,
		locks:   make(map[LockID]*lockState),
		waiting: make(map[int]*waiter),
		parked:  make(map[int]parking),
		usage:   make(map[*hold]struct{}),
		watches: make(map[ProcID]*procWatch),
		closing: make(chan struct{}),
		after:   cfg.After,
		linger:  watchLinger,

		keepContended: cfg.KeepContended,

		tokenTimeout: tokenIssueTimeout,
	}
	if w, ok := cfg.Processes.(ProcessWatcher); ok {
		e.watcher = w
	}
	if e.after == nil {
		e.after = time.After
	}
	if hb, ok := cfg.Backend.(HierarchicalBackend); ok {
		e.hier = hb.ClaimsHierarchy()
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	if e.log == nil {
		l := logrus.New()
		l.Out = io.Discard
		e.log = l
	}
	if e.now == nil {
		e.now = time.Now
	}
	if e.host == "" {
		e.host, _ = os.Hostname()
	}
	return e, nil
}

// Host returns the name this engine shows in status output.
func (e *Engine) Host() string { return e.host }

// Close refuses new locks, wakes every waiter with ErrClosed, releases every
// lease and closes the backend. Holds still in the table are dropped.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	close(e.closing)
	e.cancel()
	for _, ls := range e.locks {
		ls.wakeAllLocked()
	}
	e.mu.Unlock()
	e.wg.Wait()

	// Wait for in-flight backend calls to finish, then release the leases.
	var errs []error
	e.mu.Lock()
	for len(e.locks) > 0 {
		var busy *lockState
		for id, ls := range e.locks {
			if ls.busy {
				busy = ls
				break
			}
			lease := ls.lease
			ls.setLeaseLocked(nil)
			for _, h := range ls.holds.all() {
				delete(e.usage, h)
			}
			delete(e.locks, id)
			if lease != nil {
				e.mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := lease.Release(ctx); err != nil {
					errs = append(errs, fmt.Errorf("release %s: %w", id, err))
				}
				cancel()
				e.mu.Lock()
			}
		}
		if busy != nil {
			ch := busy.changedLocked()
			e.mu.Unlock()
			<-ch
			e.mu.Lock()
		}
	}
	e.mu.Unlock()
	if err := e.backend.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
