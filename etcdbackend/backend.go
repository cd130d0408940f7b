package etcdbackend

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockfs/lockfs/internal/logs"
	"github.com/lockfs/lockfs/lockmgr"
)

// Compile-time checks.
var (
	_ lockmgr.HierarchicalBackend = (*Backend)(nil)
	_ lockmgr.ClaimLister         = (*Backend)(nil)
	_ lockmgr.Lease               = (*lease)(nil)
	_ lockmgr.LeaseDescriber      = (*lease)(nil)
	_ lockmgr.ContendedLease      = (*lease)(nil)
)

// noWaitGiveUp bounds a claim without wait, whatever etcd does.
const noWaitGiveUp = 3 * time.Second

// closeTimeout bounds the revocation of the session lease at Close.
const closeTimeout = 5 * time.Second

// errBackendClosed is returned by calls made after (or interrupted by) Close.
var errBackendClosed = fmt.Errorf("etcd backend: %w", lockmgr.ErrClosed)

// Backend is the etcd lockmgr.Backend: each host's claim on a lock is a
// key bound to its session's etcd lease; a claim is one transaction over
// the lock's, its ancestors' and its subtree's keys. It is safe for
// concurrent use.
//
// LOCK ORDERING: a claim's slot (ownClaim.slot), then Backend.mu, then
// session.mu or lease.mu. No mutex is held across a request or a wait; a
// claim's slot is, and serialises the writes of one claim key.
type Backend struct {
	// Dependencies
	cli   *clientv3.Client
	log   logrus.FieldLogger
	clock Clock

	// Constant data
	cfg Config // with defaults
	// noHierarchy is a test hook: claims check the lock's own keys and
	// wants only, not its ancestors' or subtree's: the broken design the
	// four-host history must catch.
	noHierarchy bool
	// noApplyDeletes is a test hook: a woken claim reads its ranges again
	// before its transaction, as it once did, instead of applying the
	// watch's deletions to its snapshot.
	noApplyDeletes bool
	// perLockWants is a test hook: a claim sees the wants of its own lock
	// only, not those of its ancestors' directory locks: the old rule,
	// under which a waiter for a directory is overtaken by claims inside
	// it.
	perLockWants bool
	// wholeTreeWants is a test hook: an exclusive directory claim sees
	// the wants inside the directory too, and a claim without wait is
	// refused by any earlier want, waiting or not: the rule of 1a0c095,
	// reverted because an idle want anywhere refused a claim of the root.
	wholeTreeWants bool

	// closeCtx is cancelled when Close begins: it ends waits and the
	// background loops.
	closeCtx    context.Context
	closeCancel context.CancelFunc

	stats counters

	// startSem serialises the start of a session (capacity 1).
	startSem chan struct{}

	// Mutable state
	mu sync.Mutex
	// closed is set once Close began. GUARDED_BY(mu)
	closed bool
	// sess is the live session; nil before the first claim and after a
	// loss. GUARDED_BY(mu)
	sess *session
	// claims are this host's claim keys, held or warm, by lock.
	// INVARIANT: every claim here belongs to sess. GUARDED_BY(mu)
	claims map[lockmgr.LockID]*ownClaim
	// wants are other sessions' want keys as the want watcher last saw
	// them, by key. GUARDED_BY(mu)
	wants map[string]want
	// inflight counts API calls in progress. Add only under mu while !closed.
	inflight sync.WaitGroup
	// workers counts the session's goroutines and background drops. Add
	// only under mu while !closed, or from a worker.
	workers sync.WaitGroup
}

// New makes the etcd client and the backend. It makes no request (the
// client connects in the background): Check proves the cluster usable, and
// the first claim starts the session.
func New(cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	tlsCfg, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          cfg.RequestTimeout,
		DialKeepAliveTime:    cfg.RefreshInterval,
		DialKeepAliveTimeout: cfg.RequestTimeout,
		TLS:                  tlsCfg,
		Username:             cfg.Username,
		Password:             cfg.Password,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		// With a user, the client authenticates here.
		return nil, fmt.Errorf("%w: client of %s: %s", ErrClusterUnusable, strings.Join(cfg.Endpoints, ","), explain(cfg, err))
	}
	closeCtx, closeCancel := context.WithCancel(context.Background())
	return &Backend{
		cli:         cli,
		log:         logs.OrDiscard(cfg.Logger).WithFields(logrus.Fields{"backend": "etcd", "host": cfg.HostID}),
		clock:       cfg.Clock,
		cfg:         cfg,
		closeCtx:    closeCtx,
		closeCancel: closeCancel,
		startSem:    make(chan struct{}, 1),
		claims:      make(map[lockmgr.LockID]*ownClaim),
		wants:       make(map[string]want),
	}, nil
}

// tlsConfig loads the TLS material the configuration names, or returns nil
// for plain connections (http:// endpoints and no files). An https
// endpoint with no CA file trusts the system's CAs.
func (c Config) tlsConfig() (*tls.Config, error) {
	https := false
	for _, ep := range c.Endpoints {
		https = https || strings.HasPrefix(ep, "https://")
	}
	if c.CACert == "" && c.Cert == "" && !https {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CACert != "" {
		pem, err := os.ReadFile(c.CACert)
		if err != nil {
			return nil, fmt.Errorf("etcdbackend: --etcd-cacert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcdbackend: --etcd-cacert %s: no PEM certificate in it", c.CACert)
		}
	}
	if c.Cert != "" {
		pair, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("etcdbackend: --etcd-cert %s, --etcd-key %s: %w", c.Cert, c.Key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// ClaimsHierarchy says that a claim checks the ancestors (and, for an
// exclusive directory claim, everything below) itself.
func (b *Backend) ClaimsHierarchy() bool { return true }

// HostID returns the id this backend writes into its keys' values.
func (b *Backend) HostID() string { return b.cfg.HostID }

// Config returns the backend's configuration, defaults filled in.
func (b *Backend) Config() Config { return b.cfg }

// Stats returns the request and event counts so far.
func (b *Backend) Stats() Stats { return b.stats.snapshot() }

// enter registers an API call, or fails once Close began.
func (b *Backend) enter() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errBackendClosed
	}
	b.inflight.Add(1)
	return nil
}

// goWorker runs f as a counted background goroutine, unless Close began.
func (b *Backend) goWorker(f func()) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.workers.Add(1)
	go func() {
		defer b.workers.Done()
		f()
	}()
	return true
}

// Close stops the session's goroutines, revokes its lease (which deletes
// every claim and want key of this host in one request) and closes the
// client.
func (b *Backend) Close() error {
	s, ok := b.shutdown()
	if !ok {
		return nil
	}
	if s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		_, err := b.cli.Revoke(ctx, s.id)
		cancel()
		b.stats.requests.Add(1)
		if err != nil {
			b.log.WithError(err).WithField("session", s.sid).Warn("close: revoking the session lease failed; its claims expire with its TTL")
		}
	}
	return b.cli.Close()
}

// shutdown refuses new calls, cancels the ones in progress, stops the
// session's goroutines and waits for all of them. It returns the session
// that was live, and false if Close had already begun.
func (b *Backend) shutdown() (*session, bool) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, false
	}
	b.closed = true
	s := b.sess
	b.sess = nil
	b.mu.Unlock()
	b.closeCancel()
	b.inflight.Wait()
	if s != nil {
		s.stop()
	}
	b.workers.Wait()
	return s, true
}
