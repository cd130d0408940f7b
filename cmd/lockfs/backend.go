package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
	"github.com/lockfs/lockfs/metrics"
)

// backends are the values --backend accepts.
var backends = []string{"local", "gcs", "etcd"}

// gcsFlags are the flags of the gcs backend.
type gcsFlags struct {
	bucket   string
	prefix   string
	endpoint string
	ttl      time.Duration
	hostID   string
	// lockDelay is --lock-delay: unset means the TTL, 0 off.
	lockDelay lockDelayValue
}

// lockDelayValue is the --lock-delay flag: a duration (bare seconds
// accepted), remembered as set or not, because its default is the TTL.
type lockDelayValue struct {
	d   time.Duration
	set bool
}

func (v *lockDelayValue) Set(s string) error {
	if s == lockDelayTTL {
		*v = lockDelayValue{}
		return nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	v.d, v.set = d, true
	return nil
}

func (v *lockDelayValue) Type() string { return "duration" }

func (v *lockDelayValue) String() string {
	if !v.set {
		return lockDelayTTL
	}
	return v.d.String()
}

// lockDelayTTL is the value of --lock-delay that means its default: the
// lease TTL.
const lockDelayTTL = "ttl"

// config returns the backend's LockDelay: 0 (the default, the TTL) when
// unset, negative (off) for 0.
func (v lockDelayValue) config() time.Duration {
	switch {
	case !v.set:
		return 0
	case v.d == 0:
		return -1
	}
	return v.d
}

// lockDelayUsage is --lock-delay's help.
const lockDelayUsage = "gcs, etcd: after a host's session is declared dead (crash, pause, partition; not a clean release or lockfs break), " +
	"keep its locks from other hosts this much longer, so that a paused host stops its holders first (ttl: the lease TTL; 0: off)"

// validate checks the gcs flags against the chosen backend.
func (g gcsFlags) validate(backend string) error {
	if backend != "gcs" {
		if g.bucket != "" || g.prefix != "" || g.endpoint != "" {
			return usagef("--gcs-* flags need --backend gcs")
		}
		if (g.hostID != "" || g.lockDelay.set) && backend != "etcd" {
			return usagef("--host-id and --lock-delay need --backend gcs or etcd")
		}
		return nil
	}
	if g.bucket == "" {
		return usagef("--backend gcs needs --gcs-bucket")
	}
	if ttl := durationValue(g.ttl); g.ttl < gcsbackend.MinTTL {
		return usagef("--lease-ttl %v: want %v or more (default %v). A lease is how long this host's locks outlive "+
			"its last heartbeat: with 0 every lock would be lost as it is granted, and a crashed host's locks "+
			"taken over at once", ttl.String(), gcsbackend.MinTTL, gcsbackend.DefaultTTL)
	}
	cfg := g.config(nil)
	if err := cfg.Validate(); err != nil {
		return usagef("%v", err)
	}
	return nil
}

func (g gcsFlags) config(log logrus.FieldLogger) gcsbackend.Config {
	return gcsbackend.Config{Bucket: g.bucket, Prefix: g.prefix, Endpoint: g.endpoint, TTL: g.ttl, HostID: g.hostID,
		LockDelay: g.lockDelay.config(), Logger: log}
}

// newBackend builds the backend the flags choose. For gcs it checks the
// bucket first (gcsbackend.Backend.Check) and also returns a function that
// reads the request counters, for metrics.
func newBackend(mf mountFlags, source string, log logrus.FieldLogger) (lockmgr.Backend, string, func() []metrics.Count, error) {
	switch mf.backend {
	case "etcd":
		return newEtcdBackend(mf, log)
	case "gcs":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := gcsbackend.New(ctx, mf.gcs.config(log))
		if err != nil {
			return nil, "", nil, err
		}
		// Refuse to mount on a bucket that cannot hold locks, rather than
		// fail the first lock.
		if err := b.Check(ctx); err != nil {
			b.Close()
			return nil, "", nil, err
		}
		return b, b.HostID(), func() []metrics.Count { return gcsCounts(b.Stats()) }, nil
	default:
		keep := mf.keepShared
		switch {
		case keep < 0:
			return nil, "", nil, fmt.Errorf("--keep-shared-locks %v: must not be negative (0 turns the keep off)", keep)
		case keep == 0:
			keep = -1 // off
		}
		b, err := localbackend.New(localbackend.Config{Source: source, Logger: log, AllowNetworkFS: mf.allowRemote, KeepShared: keep})
		if err != nil {
			return nil, "", nil, err
		}
		return b, "", nil, nil
	}
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

// describeBackend is the backend as the startup log line names it.
func describeBackend(mf mountFlags, hostID string) string {
	switch mf.backend {
	case "etcd":
		return mf.etcd.describe() + " host=" + hostID
	case "gcs":
	default:
		return mf.backend
	}
	s := fmt.Sprintf("gcs bucket=%s", mf.gcs.bucket)
	if mf.gcs.prefix != "" {
		s += " prefix=" + mf.gcs.prefix
	}
	if mf.gcs.endpoint != "" {
		s += " endpoint=" + mf.gcs.endpoint
	}
	return s + " host=" + hostID
}
