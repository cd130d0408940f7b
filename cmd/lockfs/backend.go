package main

import (
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/daemon"
	"github.com/lockfs/lockfs/gcsbackend"
)

// backends are the values --backend accepts.
var backends = daemon.Backends

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
