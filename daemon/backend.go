package daemon

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/internal/logs"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
	"github.com/lockfs/lockfs/metrics"
)

// checkTimeout bounds building a network backend and checking it.
const checkTimeout = 30 * time.Second

// builtBackend is a backend with what the daemon needs to know of it.
type builtBackend struct {
	b      lockmgr.Backend
	hostID string                 // "" for local
	counts func() []metrics.Count // its request counters, nil if none
}

// newBackend builds the backend cfg chooses. A network backend is checked
// first (gcs: the bucket can hold locks; etcd: the cluster answers), so
// that a mount is refused rather than its first lock failed.
func newBackend(cfg *Config, log logrus.FieldLogger) (builtBackend, error) {
	if cfg.Use != nil {
		return builtBackend{b: cfg.Use, hostID: hostIDOf(cfg.Use)}, nil
	}
	switch cfg.Backend {
	case Etcd:
		return newEtcdBackend(cfg, log)
	case GCS:
		return newGCSBackend(cfg, log)
	}
	lc := cfg.Local
	if lc.Source == "" {
		lc.Source = cfg.FS.Source
	}
	if lc.Logger == nil {
		lc.Logger = log
	}
	b, err := localbackend.New(lc)
	if err != nil {
		return builtBackend{}, err
	}
	return builtBackend{b: b}, nil
}

// CheckBackend builds the backend cfg chooses, which checks a network
// backend as Start does, and closes it: what "lockfs doctor" asks.
func CheckBackend(cfg Config) error {
	bb, err := newBackend(&cfg, logs.OrDiscard(cfg.Logger))
	if err != nil {
		return err
	}
	return bb.b.Close()
}

// hostIDOf is the host id of a backend that has one.
func hostIDOf(b lockmgr.Backend) string {
	if h, ok := b.(interface{ HostID() string }); ok {
		return h.HostID()
	}
	return ""
}

func newGCSBackend(cfg *Config, log logrus.FieldLogger) (builtBackend, error) {
	gc := cfg.GCS
	if gc.Logger == nil {
		gc.Logger = log
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	b, err := gcsbackend.New(ctx, gc)
	if err != nil {
		return builtBackend{}, err
	}
	if err := b.Check(ctx); err != nil {
		b.Close()
		return builtBackend{}, err
	}
	return builtBackend{b: b, hostID: b.HostID(), counts: func() []metrics.Count { return gcsCounts(b.Stats()) }}, nil
}

// newEtcdBackend builds the etcd backend and checks the cluster, logging
// endpoints that do not answer while others do.
func newEtcdBackend(cfg *Config, log logrus.FieldLogger) (builtBackend, error) {
	ec := cfg.Etcd
	if ec.Logger == nil {
		ec.Logger = log
	}
	if cfg.EtcdPasswordFile != "" {
		b, err := os.ReadFile(cfg.EtcdPasswordFile)
		if err != nil {
			return builtBackend{}, fmt.Errorf("--etcd-password-file: %w", err)
		}
		ec.Password, _, _ = strings.Cut(strings.TrimRight(string(b), "\r\n"), "\n")
	}
	b, err := etcdbackend.New(ec)
	if err != nil {
		return builtBackend{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	warnings, err := b.Check(ctx)
	if err != nil {
		b.Close()
		return builtBackend{}, err
	}
	for _, w := range warnings {
		log.WithField("endpoint", w).Warn("etcd endpoint does not answer; using the others")
	}
	return builtBackend{b: b, hostID: b.HostID(), counts: func() []metrics.Count { return etcdCounts(b.Stats()) }}, nil
}

// gcsCounts turns the gcs backend's counters into metric samples.
func gcsCounts(s gcsbackend.Stats) []metrics.Count {
	return []metrics.Count{
		{Op: "read", Outcome: "ok", N: s.Reads - s.ReadsNotFound},
		{Op: "read", Outcome: "not_found", N: s.ReadsNotFound},
		{Op: "write", Outcome: "ok", N: s.WritesOK},
		{Op: "write", Outcome: "precondition_failed", N: s.PreconditionFailed},
		{Op: "any", Outcome: "rate_limited", N: s.RateLimited},
		{Op: "any", Outcome: "server_error", N: s.ServerErrors},
		{Op: "any", Outcome: "network_error", N: s.NetworkErrors},
		{Op: "any", Outcome: "other_error", N: s.OtherErrors},
		{Op: "write", Outcome: "ambiguous", N: s.Ambiguous},
		{Op: "list", Outcome: "any", N: s.Lists},
		{Op: "delete", Outcome: "any", N: s.Deletes},
		{Op: "lease", Outcome: "claim", N: s.Claims - s.WarmClaims},
		{Op: "lease", Outcome: "warm_claim", N: s.WarmClaims},
		{Op: "lease", Outcome: "session", N: s.Sessions},
		{Op: "lease", Outcome: "withdrawal", N: s.Withdrawals},
		{Op: "lease", Outcome: "want_sent", N: s.WantsSent},
		{Op: "lease", Outcome: "want_served", N: s.WantsServed},
		{Op: "lease", Outcome: "refresh", N: s.Refreshes},
		{Op: "lease", Outcome: "release", N: s.Releases},
		{Op: "lease", Outcome: "lost", N: s.Losses},
		{Op: "lease", Outcome: "takeover", N: s.Takeovers},
		{Op: "lease", Outcome: "lock_delay", N: s.LockDelays},
		{Op: "lease", Outcome: "contended", N: s.Contended},
		{Op: "lease", Outcome: "ring", N: s.Rings},
	}
}

// etcdCounts turns the etcd backend's counters into metric samples.
func etcdCounts(s etcdbackend.Stats) []metrics.Count {
	return []metrics.Count{
		{Op: "any", Outcome: "ok", N: s.Requests - s.Failures},
		{Op: "any", Outcome: "failed", N: s.Failures},
		{Op: "txn", Outcome: "claim", N: s.Txns},
		{Op: "txn", Outcome: "read", N: s.Reads},
		{Op: "watch", Outcome: "wait", N: s.Watches},
		{Op: "lease", Outcome: "claim", N: s.Claims},
		{Op: "lease", Outcome: "warm_claim", N: s.WarmClaims},
		{Op: "lease", Outcome: "session", N: s.Sessions},
		{Op: "lease", Outcome: "session_lost", N: s.SessionsLost},
		{Op: "lease", Outcome: "want_sent", N: s.WantsSent},
		{Op: "lease", Outcome: "drop", N: s.Drops},
		{Op: "lease", Outcome: "refresh", N: s.KeepAlives},
		{Op: "lease", Outcome: "release", N: s.Releases},
		{Op: "lease", Outcome: "lost", N: s.Losses},
	}
}
