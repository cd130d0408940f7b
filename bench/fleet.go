package bench

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/faultproxy"
	"github.com/lockfs/lockfs/lockmgr"
)

// fleetLocks is the size of each fleet host's rotating set of locks.
const fleetLocks = 4

// fleetWorkers is the number of clients (processes, to the engine) that
// churn on each fleet host, each on its own rotating set.
const fleetWorkers = 2

// gcsEnv is an emulator with a counting proxy in front, for one
// measurement.
type gcsEnv struct {
	emu   *emulator
	proxy *countingProxy
}

func (e *gcsEnv) close() {
	e.proxy.close()
	e.emu.stop(time.Second)
}

// startGCS starts an emulator and a proxy for one measurement. If the
// emulator cannot be built it records keys as null with the reason and
// returns nil, nil.
func (r *runner) startGCS(ctx context.Context, what string, keys []string) (*gcsEnv, error) {
	bin, err := emulatorBinary(ctx, r.modDir)
	if err != nil {
		reason := fmt.Sprintf("cannot build the GCS emulator %s: %v", benchEmulator, err)
		r.nullKeys(what, keys, reason)
		return nil, nil
	}
	env := &gcsEnv{}
	if env.emu, err = startEmulator(ctx, bin, r.logDir, gcsBucket); err != nil {
		return nil, err
	}
	if env.proxy, err = startCountingProxy(env.emu.url); err != nil {
		env.emu.stop(time.Second)
		return nil, err
	}
	return env, nil
}

// nullKeys records keys as null, with reason under what_unavailable_reason
// and a row saying so.
func (r *runner) nullKeys(what string, keys []string, reason string) {
	r.logf("%s: unavailable: %s", what, reason)
	for _, k := range keys {
		r.res.setNull(k)
	}
	r.res.notes[what+"_unavailable_reason"] = reason
	r.res.addRow(Row{what, "unavailable: " + reason, "", "", "", "n/a"})
}

// gcsClientHost is one host of the fleet and sim measurements: a backend
// with its own storage client and session, and an engine over it.
type gcsClientHost struct {
	b *gcsbackend.Backend
	e *lockmgr.Engine
}

func newClientHost(ctx context.Context, cfg gcsbackend.Config, lost *atomic.Int64) (*gcsClientHost, error) {
	b, err := gcsbackend.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	e, err := engineOver(b, func(lockmgr.LostHold) { lost.Add(1) })
	if err != nil {
		return nil, err
	}
	return &gcsClientHost{b: b, e: e}, nil
}

// closeHosts closes every host at once: each releases what it holds within
// its UnavailableAfter.
func closeHosts(hosts []*gcsClientHost) {
	var wg sync.WaitGroup
	for _, h := range hosts {
		if h == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.e.Close() // a release that failed expires after its TTL
		}()
	}
	wg.Wait()
}

var fleetKeys = []string{"gcs_fleet_acquires_per_s", "gcs_fleet_lease_losses", "gcs_fleet_max_object_writes_per_s"}

// gcsFleet: Config.GCSFleetHosts hosts, each an engine and a backend with a
// storage client and host id of its own (default TTL), churn their own
// locks under one shared parent ("fleet/h<i>/k<j>", fleetWorkers clients
// per host, each cycling exclusively through fleetLocks locks of its own,
// acquire with wait then release) for Config.GCSFleetDur, with GCS's
// per-object write limit (1/s, burst 5, 429 beyond) enforced by the proxy.
//
// Keys: gcs_fleet_acquires_per_s (all hosts), gcs_fleet_lease_losses (holds
// lost, as the engines report them), gcs_fleet_max_object_writes_per_s (the
// busiest object's write requests, 429s included, per second of the run);
// gcs_fleet_peak_object_writes_in_1s (the most one object received in any
// one second), gcs_fleet_429s, gcs_fleet_failed_acquires (errors, each
// acquire bounded by 30 s), gcs_fleet_acquire_p50_ms and _p99_ms,
// gcs_fleet_writes_per_s, gcs_fleet_reads_per_s, gcs_fleet_hosts.
func (r *runner) gcsFleet(ctx context.Context) error {
	env, err := r.startGCS(ctx, "gcs_fleet", fleetKeys)
	if env == nil || err != nil {
		return err
	}
	defer env.close()
	env.proxy.SetLimits(faultproxy.Limits{ObjectWrites: true})
	n := r.cfg.GCSFleetHosts
	var lost atomic.Int64
	hosts := make([]*gcsClientHost, n)
	defer func() { closeHosts(hosts) }()
	for i := range hosts {
		hosts[i], err = newClientHost(ctx, gcsbackend.Config{Bucket: gcsBucket, Endpoint: env.proxy.endpoint(),
			Prefix: "fleet/", HostID: fmt.Sprintf("fleet-h%d", i)}, &lost)
		if err != nil {
			return err
		}
	}
	env.proxy.ResetTraffic()
	engines := make([]*lockmgr.Engine, n)
	for i, h := range hosts {
		engines[i] = h.e
	}
	var tr faultproxy.Traffic
	ch := r.churn(ctx, "gcs fleet", engines, r.cfg.GCSFleetDur, func() { tr = env.proxy.Traffic() })
	dur, lat := ch.dur, ch.lat
	acquires, failed := ch.acquires, ch.failed
	busiest, writes := tr.MostWritten()
	peakName, peak := tr.Busiest()
	sort.Float64s(lat)
	res := r.res
	res.set("gcs_fleet_hosts", float64(n))
	res.set("gcs_fleet_duration_s", dur)
	res.set("gcs_fleet_acquires_per_s", float64(acquires)/dur)
	res.set("gcs_fleet_lease_losses", float64(lost.Load()))
	res.set("gcs_fleet_max_object_writes_per_s", float64(writes)/dur)
	res.set("gcs_fleet_peak_object_writes_in_1s", float64(peak))
	res.set("gcs_fleet_429s", float64(tr.Limited))
	res.set("gcs_fleet_failed_acquires", float64(failed))
	res.set("gcs_fleet_acquire_p50_ms", quantile(lat, 0.5))
	res.set("gcs_fleet_acquire_p99_ms", quantile(lat, 0.99))
	res.set("gcs_fleet_writes_per_s", float64(tr.Kinds[faultproxy.KindWrite])/dur)
	res.set("gcs_fleet_reads_per_s", float64(tr.Kinds[faultproxy.KindRead]+tr.Kinds[faultproxy.KindMetadata]+tr.Kinds[faultproxy.KindList])/dur)
	r.logf("gcs fleet: %d hosts, %.1fs: %d acquires (%d failed), p99 %.1f ms, %d losses, %d × 429; busiest object %s: %d writes (peak %d in 1s, %s)",
		n, dur, acquires, failed, quantile(lat, 0.99), lost.Load(), tr.Limited, busiest, writes, peak, peakName)

	what := fmt.Sprintf("%d hosts churning under one parent, %v, write limit on", n, r.cfg.GCSFleetDur)
	for _, k := range []struct {
		name, key, ref string
		g              goal
	}{
		{"GCS fleet: acquires/s, " + what, "gcs_fleet_acquires_per_s",
			fmt.Sprintf("p50 %s ms, p99 %s ms; %d failed", fmtNum(quantile(lat, 0.5)), fmtNum(quantile(lat, 0.99)), failed), atLeast(500)},
		{"GCS fleet: holds lost", "gcs_fleet_lease_losses", "", equal(0)},
		{"GCS fleet: busiest object's writes/s (429s included)", "gcs_fleet_max_object_writes_per_s",
			fmt.Sprintf("peak %d in 1 s; %d × 429 in all", peak, tr.Limited), atMost(1)},
	} {
		v, _ := res.Value(k.key)
		gt, met := res.met(k.key, &k.g)
		res.addRow(Row{k.name, fmtNum(v), k.ref, "", gt, met})
	}
	return nil
}

// churned is what a fleet's churn did within its window.
type churned struct {
	dur              float64   // the window, s
	acquires, failed int64     // acquires granted, and failed, within it
	lat              []float64 // each granted acquire's time, ms, sorted
}

// churn has every engine's fleetWorkers clients cycle exclusively through
// fleetLocks locks of their own under one parent ("parent/h<i>/k<j>",
// acquire with wait, bounded by 30 s, then release) for dur. atEnd runs
// when the window ends, before the last releases finish.
func (r *runner) churn(ctx context.Context, what string, engines []*lockmgr.Engine, dur time.Duration, atEnd func()) churned {
	var (
		acquires, failed atomic.Int64
		latMu            sync.Mutex
		lat              []float64
		wg               sync.WaitGroup
	)
	runCtx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	start := time.Now()
	for i, e := range engines {
		for w := 0; w < fleetWorkers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []float64
				defer func() { latMu.Lock(); lat = append(lat, mine...); latMu.Unlock() }()
				for j := 0; runCtx.Err() == nil; j++ {
					req := gcsRequest(fmt.Sprintf("parent/h%d/k%d", i, w*fleetLocks+j%fleetLocks), w+1, true)
					actx, acancel := context.WithTimeout(runCtx, 30*time.Second)
					t0 := time.Now()
					_, err := e.Acquire(actx, req)
					acancel()
					if err != nil {
						if runCtx.Err() == nil {
							failed.Add(1)
							r.logf("%s: host %d: %v", what, i, err)
						}
						continue
					}
					if runCtx.Err() == nil { // within the window
						mine = append(mine, float64(time.Since(t0))/1e6)
						acquires.Add(1)
					}
					rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
					if err := e.Release(rctx, req.Lock, req.Owner); err != nil {
						r.logf("%s: host %d: release: %v", what, i, err)
					}
					rcancel()
				}
			}()
		}
	}
	// The window's figures; then let the last releases finish.
	<-runCtx.Done()
	out := churned{dur: time.Since(start).Seconds()}
	if atEnd != nil {
		atEnd()
	}
	wg.Wait()
	out.acquires, out.failed = acquires.Load(), failed.Load()
	sort.Float64s(lat)
	out.lat = lat
	return out
}

// quantile returns the q-quantile of sorted xs (NaN if empty).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
