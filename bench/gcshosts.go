package bench

// The hosts of the gcs measurements: each a gcs backend under an
// in-process daemon without a mount.

import (
	"context"
	"fmt"
	"time"

	"github.com/lockfs/lockfs/daemon"
	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// host is one daemon's backend and engine.
type gcsHost struct {
	b *gcsbackend.Backend
	e *lockmgr.Engine
}

// engineOver starts an in-process daemon without a mount over b (a gcs
// backend whose requests the bench counts) and returns its engine, whose
// Close stops it. The daemon owns b from here on, even on error.
func engineOver(b lockmgr.Backend, onLoss func(lockmgr.LostHold)) (*lockmgr.Engine, error) {
	d, err := daemon.Start(daemon.Config{Use: b, Processes: soloProcs{}, OnLoss: onLoss})
	if err != nil {
		return nil, err
	}
	return d.Engine(), nil
}

func (h *gcsHost) close() {
	if err := h.e.Close(); err != nil {
		_ = err // a release that failed at close expires after its TTL
	}
}

// gcsConfig is the backend configuration of host name under prefix.
func (g *gcsRun) gcsConfig(prefix, name string) gcsbackend.Config {
	return gcsbackend.Config{
		Bucket:   gcsBucket,
		Prefix:   prefix,
		Endpoint: g.proxy.endpoint(),
		TTL:      g.ttl,
		HostID:   name,
	}
}

// handoffTTL is the TTL of the local hand-off's host: its refreshes (one
// every TTL/3) must leave room for the hand-off's window (about 300 ms of
// settling), or every window meets one. With the smoke run's 1 s TTL they
// came every 333 ms, and the run failed now and then.
const handoffTTL = 30 * time.Second

// newHost starts a backend and an engine on a fresh prefix (or the given one).
func (g *gcsRun) newHost(ctx context.Context, prefix string) (*gcsHost, string, error) {
	return g.newHostLoss(ctx, prefix, nil)
}

// newHostLoss is newHost with an engine that reports every lost hold to
// onLoss.
func (g *gcsRun) newHostLoss(ctx context.Context, prefix string, onLoss func(lockmgr.LostHold)) (*gcsHost, string, error) {
	return g.newHostTTL(ctx, prefix, g.ttl, onLoss)
}

// newHostTTL is newHostLoss with a TTL of its own; the run's refresh
// interval is recorded from hosts with the run's TTL only.
func (g *gcsRun) newHostTTL(ctx context.Context, prefix string, ttl time.Duration, onLoss func(lockmgr.LostHold)) (*gcsHost, string, error) {
	g.seq++
	if prefix == "" {
		prefix = fmt.Sprintf("run%d/", g.seq)
	}
	cfg := g.gcsConfig(prefix, fmt.Sprintf("bench-host-%d", g.seq))
	cfg.TTL = ttl
	b, err := gcsbackend.New(ctx, cfg)
	if err != nil {
		return nil, "", err
	}
	if ttl == g.ttl {
		g.refreshInterval = b.Config().RefreshInterval
	}
	e, err := engineOver(b, onLoss)
	if err != nil {
		return nil, "", err
	}
	return &gcsHost{b: b, e: e}, prefix, nil
}

// request is an exclusive flock-style request by client c, a process of
// its own.
func gcsRequest(path string, c int, wait bool) lockmgr.Request {
	return lockmgr.Request{Lock: lockmgr.LockID{Path: path, Kind: lockmgr.KindDir}, Mode: lockmgr.Exclusive,
		Owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: uint64(c)}, TID: c, Wait: wait}
}

// soloProcs is a process tree where every thread id is a process of its
// own with no ancestors: the engine's clients are strangers to each other.
type soloProcs struct{}

func (soloProcs) Lineage(tid int) (lockmgr.Lineage, error) {
	return lockmgr.Lineage{{PID: tid, Start: 1}}, nil
}

func (soloProcs) Alive(lockmgr.ProcID) bool { return true }
