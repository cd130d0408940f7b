package bench

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// fleet: Config.GCSFleetHosts hosts on etcd, each an engine over a backend
// with a client, session and host id of its own (default TTL), churn their
// own locks under one shared parent as the gcs fleet does (bench/fleet.go),
// for a sixth of GCSFleetDur (make bench stays under 12 min).
func (e *etcdRun) fleet(ctx context.Context) error {
	n := e.r.cfg.GCSFleetHosts
	var lost atomic.Int64
	backends := make([]*etcdbackend.Backend, 0, n)
	engines := make([]*lockmgr.Engine, 0, n)
	defer func() {
		var wg sync.WaitGroup
		for _, en := range engines {
			wg.Add(1)
			go func() { defer wg.Done(); en.Close() }()
		}
		wg.Wait()
	}()
	for range n {
		b, err := e.backend("bench-fleet/")
		if err != nil {
			return err
		}
		en, err := engineOver(b, func(lockmgr.LostHold) { lost.Add(1) })
		if err != nil {
			b.Close()
			return err
		}
		backends = append(backends, b)
		engines = append(engines, en)
	}
	requests := func() (n uint64) {
		for _, b := range backends {
			n += b.Stats().Requests
		}
		return n
	}
	before := requests()
	var after uint64
	ch := e.r.churn(ctx, "etcd fleet", engines, e.r.cfg.GCSFleetDur/6, func() { after = requests() })
	e.fleetHosts, e.fleetDur = n, ch.dur
	e.fleetAcquires, e.fleetFailed, e.fleetLat = ch.acquires, ch.failed, ch.lat
	e.fleetLost, e.fleetRequests = lost.Load(), after-before
	return nil
}
