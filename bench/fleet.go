package bench

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

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
	e, err := lockmgr.New(lockmgr.Config{Backend: b, Processes: soloProcs{}, Host: cfg.HostID,
		OnLoss: func(lockmgr.LostHold) { lost.Add(1) }})
	if err != nil {
		b.Close()
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
	var (
		acquires, failed atomic.Int64
		latMu            sync.Mutex
		lat              []float64
		wg               sync.WaitGroup
	)
	runCtx, cancel := context.WithTimeout(ctx, r.cfg.GCSFleetDur)
	defer cancel()
	start := time.Now()
	for i, h := range hosts {
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
					_, err := h.e.Acquire(actx, req)
					acancel()
					if err != nil {
						if runCtx.Err() == nil {
							failed.Add(1)
							r.logf("gcs fleet: host %d: %v", i, err)
						}
						continue
					}
					if runCtx.Err() == nil { // within the window
						mine = append(mine, float64(time.Since(t0))/1e6)
						acquires.Add(1)
					}
					rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
					if err := h.e.Release(rctx, req.Lock, req.Owner); err != nil {
						r.logf("gcs fleet: host %d: release: %v", i, err)
					}
					rcancel()
				}
			}()
		}
	}
	// The window's figures; then let the last releases finish.
	<-runCtx.Done()
	dur := time.Since(start).Seconds()
	tr := env.proxy.Traffic()
	wg.Wait()
	busiest, writes := tr.MostWritten()
	peakName, peak := tr.Busiest()
	sort.Float64s(lat)
	res := r.res
	res.set("gcs_fleet_hosts", float64(n))
	res.set("gcs_fleet_duration_s", dur)
	res.set("gcs_fleet_acquires_per_s", float64(acquires.Load())/dur)
	res.set("gcs_fleet_lease_losses", float64(lost.Load()))
	res.set("gcs_fleet_max_object_writes_per_s", float64(writes)/dur)
	res.set("gcs_fleet_peak_object_writes_in_1s", float64(peak))
	res.set("gcs_fleet_429s", float64(tr.Limited))
	res.set("gcs_fleet_failed_acquires", float64(failed.Load()))
	res.set("gcs_fleet_acquire_p50_ms", quantile(lat, 0.5))
	res.set("gcs_fleet_acquire_p99_ms", quantile(lat, 0.99))
	res.set("gcs_fleet_writes_per_s", float64(tr.Kinds[faultproxy.KindWrite])/dur)
	res.set("gcs_fleet_reads_per_s", float64(tr.Kinds[faultproxy.KindRead]+tr.Kinds[faultproxy.KindMetadata]+tr.Kinds[faultproxy.KindList])/dur)
	r.logf("gcs fleet: %d hosts, %.1fs: %d acquires (%d failed), p99 %.1f ms, %d losses, %d × 429; busiest object %s: %d writes (peak %d in 1s, %s)",
		n, dur, acquires.Load(), failed.Load(), quantile(lat, 0.99), lost.Load(), tr.Limited, busiest, writes, peak, peakName)

	what := fmt.Sprintf("%d hosts churning under one parent, %v, write limit on", n, r.cfg.GCSFleetDur)
	for _, k := range []struct {
		name, key, ref string
		g              goal
	}{
		{"GCS fleet: acquires/s, " + what, "gcs_fleet_acquires_per_s",
			fmt.Sprintf("p50 %s ms, p99 %s ms; %d failed", fmtNum(quantile(lat, 0.5)), fmtNum(quantile(lat, 0.99)), failed.Load()), atLeast(500)},
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

// quantile returns the q-quantile of sorted xs (NaN if empty).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

var (
	simKeys        = []string{"gcs_sim_1000_hosts_writes_per_s", "gcs_sim_1000_hosts_losses"}
	simReducedKeys = []string{"gcs_sim_1000_hosts_reduced_writes_per_s", "gcs_sim_1000_hosts_reduced_losses",
		"gcs_sim_1000_hosts_reduced_locks_held"}
)

// simParents is the number of shared parents the sim's locks live under.
const simParents = 4

// gcsSim: Config.GCSSimHosts backends in this process, each with its own
// session, storage client and engine (default TTL), each taking exclusive
// locks "s<j%4>/h<i>-k<j>" (so every host's locks sit under the same few
// parents), in two loads:
//
//   - reduced: Config.GCSSimReducedLocks locks each, taken within
//     Config.GCSSimReducedSetup, then held for Config.GCSSimDur while the
//     requests reaching the emulator are counted. Keys:
//     gcs_sim_1000_hosts_reduced_writes_per_s,
//     gcs_sim_1000_hosts_reduced_losses (holds lost from the first acquire
//     to the end of the steady period), gcs_sim_1000_hosts_reduced_locks_held,
//     gcs_sim_reduced_locks_per_host, gcs_sim_reduced_{reads,metadata,lists}_per_s,
//     gcs_sim_reduced_setup_s.
//   - full: the rest of Config.GCSSimLocks each, taken within
//     Config.GCSSimProbe, then held for Config.GCSSimDur. Keys:
//     gcs_sim_1000_hosts_writes_per_s, gcs_sim_1000_hosts_losses (from the
//     first acquire), gcs_sim_{reads,metadata,lists}_per_s, gcs_sim_setup_s,
//     gcs_sim_hosts, gcs_sim_locks. If the locks are not all held by the
//     end of the probe, the two main keys are null and
//     gcs_sim_unavailable_reason gives the setup rate measured in the
//     probe and the time it projects for the whole load.
func (r *runner) gcsSim(ctx context.Context) error {
	// Each client keeps connections of its own, twice over in this process
	// (client and proxy ends).
	if err := raiseNofile(uint64(8*r.cfg.GCSSimHosts + heldReserve)); err != nil {
		var lim unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil && lim.Cur < lim.Max {
			lim.Cur = lim.Max
			unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
		}
	}
	env, err := r.startGCS(ctx, "gcs_sim", append(simKeys, simReducedKeys...))
	if env == nil || err != nil {
		return err
	}
	defer env.close()
	n, per, reduced := r.cfg.GCSSimHosts, r.cfg.GCSSimLocks, r.cfg.GCSSimReducedLocks
	var lost atomic.Int64
	hosts := make([]*gcsClientHost, n)
	defer func() {
		start := time.Now()
		closeHosts(hosts)
		r.logf("gcs sim: %d hosts closed in %v", n, time.Since(start).Round(time.Millisecond))
	}()
	for i := range hosts {
		hosts[i], err = newClientHost(ctx, gcsbackend.Config{Bucket: gcsBucket, Endpoint: env.proxy.endpoint(),
			Prefix: "sim/", HostID: fmt.Sprintf("sim-h%d", i)}, &lost)
		if err != nil {
			return err
		}
	}
	res := r.res
	res.set("gcs_sim_hosts", float64(n))
	res.set("gcs_sim_locks", float64(n*per))
	res.set("gcs_sim_reduced_locks_per_host", float64(reduced))

	// The reduced load.
	held, setup, err := simTake(ctx, hosts, 0, reduced, r.cfg.GCSSimReducedSetup)
	res.set("gcs_sim_reduced_setup_s", setup.Seconds())
	if err != nil {
		// What was taken within the bound is the load measured; without
		// any, there is nothing to measure.
		tr := env.proxy.Kinds()
		reason := fmt.Sprintf("%d of %d locks held after %v (%d writes and %d reads sent meanwhile; %d holds lost): %v",
			held, n*reduced, setup.Round(time.Second), tr[faultproxy.KindWrite], tr[faultproxy.KindRead], lost.Load(), err)
		if held == 0 {
			r.nullKeys("gcs_sim_reduced", simReducedKeys, reason)
			r.nullKeys("gcs_sim", simKeys, "the reduced load did not set up: "+reason)
			return nil
		}
		res.notes["gcs_sim_reduced_partial_reason"] = "the steady period holds only what was taken within the setup bound: " + reason
		r.logf("gcs sim: reduced load partial: %s", reason)
		// The setup's rate already rules the full load out: no probe.
		rate := float64(held) / setup.Seconds()
		r.nullKeys("gcs_sim", simKeys, fmt.Sprintf("the reduced load did not set up, so no probe of the full one: %s "+
			"(%.0f acquires/s; all %d would take at least %v at that rate)", reason, rate, n*per, (time.Duration(float64(n*per)/rate)*time.Second).Round(time.Second)))
	}
	r.logf("gcs sim: %d hosts hold %d locks (%d each wanted) after %v (%d lost so far)", n, held, reduced, setup.Round(time.Millisecond), lost.Load())
	mix, serr := simSteady(ctx, env.proxy, r.cfg.GCSSimDur)
	if serr != nil {
		return serr
	}
	res.set("gcs_sim_1000_hosts_reduced_writes_per_s", mix[faultproxy.KindWrite])
	res.set("gcs_sim_1000_hosts_reduced_losses", float64(lost.Load()))
	res.set("gcs_sim_1000_hosts_reduced_locks_held", float64(held))
	res.set("gcs_sim_reduced_reads_per_s", mix[faultproxy.KindRead])
	res.set("gcs_sim_reduced_metadata_per_s", mix[faultproxy.KindMetadata])
	res.set("gcs_sim_reduced_lists_per_s", mix[faultproxy.KindList])
	r.logf("gcs sim reduced: %v steady: %.1f writes/s, %.1f reads/s, %.1f metadata/s, %.1f lists/s; %d holds lost",
		r.cfg.GCSSimDur, mix[faultproxy.KindWrite], mix[faultproxy.KindRead], mix[faultproxy.KindMetadata], mix[faultproxy.KindList], lost.Load())
	res.addRow(Row{fmt.Sprintf("GCS sim, reduced load: writes/s reaching GCS, %d hosts × %d locks (%d held), default TTL, %v steady",
		n, reduced, held, r.cfg.GCSSimDur), fmtNum(mix[faultproxy.KindWrite]), simMix(mix, setup) + fmt.Sprintf("; %d holds lost", lost.Load()),
		"", "", "n/a"})
	if err != nil {
		return nil
	}

	// The full load: the rest of the locks, within the probe.
	more, setup, err := simTake(ctx, hosts, reduced, per, r.cfg.GCSSimProbe)
	held += more
	res.set("gcs_sim_setup_s", setup.Seconds())
	if err != nil {
		rate := float64(more) / setup.Seconds()
		projected := "never (none taken)"
		if more > 0 {
			projected = fmt.Sprintf("at least %v", (time.Duration(float64(n*per-reduced*n)/rate) * time.Second).Round(time.Second))
		}
		tr := env.proxy.Kinds()
		r.nullKeys("gcs_sim", simKeys, fmt.Sprintf("%d of %d locks held after a %v probe on top of the reduced load "+
			"(%.0f acquires/s; the other %d would take %s at that rate; %d writes and %d reads sent since the start; %d holds lost): %v",
			held, n*per, setup.Round(time.Second), rate, n*per-n*reduced, projected, tr[faultproxy.KindWrite], tr[faultproxy.KindRead], lost.Load(), err))
		return nil
	}
	r.logf("gcs sim: %d hosts hold %d locks after %v more (%d lost so far)", n, held, setup.Round(time.Millisecond), lost.Load())
	mix, err = simSteady(ctx, env.proxy, r.cfg.GCSSimDur)
	if err != nil {
		return err
	}
	res.set("gcs_sim_1000_hosts_writes_per_s", mix[faultproxy.KindWrite])
	res.set("gcs_sim_1000_hosts_losses", float64(lost.Load()))
	res.set("gcs_sim_reads_per_s", mix[faultproxy.KindRead])
	res.set("gcs_sim_metadata_per_s", mix[faultproxy.KindMetadata])
	res.set("gcs_sim_lists_per_s", mix[faultproxy.KindList])
	r.logf("gcs sim: %v steady: %.1f writes/s, %.1f reads/s, %.1f metadata/s, %.1f lists/s; %d holds lost",
		r.cfg.GCSSimDur, mix[faultproxy.KindWrite], mix[faultproxy.KindRead], mix[faultproxy.KindMetadata], mix[faultproxy.KindList], lost.Load())
	what := fmt.Sprintf("%d hosts × %d locks, default TTL, %v steady", n, per, r.cfg.GCSSimDur)
	g := atMost(150)
	gt, met := res.met("gcs_sim_1000_hosts_writes_per_s", &g)
	res.addRow(Row{"GCS sim: writes/s reaching GCS, " + what, fmtNum(mix[faultproxy.KindWrite]), simMix(mix, setup), "", gt, met})
	g = equal(0)
	gt, met = res.met("gcs_sim_1000_hosts_losses", &g)
	res.addRow(Row{"GCS sim: holds lost", fmtNum(float64(lost.Load())), "", "", gt, met})
	return nil
}

// simSetupWorkers is the number of acquires in flight during the sim's
// setup.
const simSetupWorkers = 16

// simTake has every host take its locks from..to-1 (round robin over the
// hosts) within bound, and returns how many it took and how long it took.
// A failed acquire (the backend gave up after UnavailableAfter) is counted
// and the rest go on (a fleet would retry it later); the error then names
// the first.
func simTake(ctx context.Context, hosts []*gcsClientHost, from, to int, bound time.Duration) (int64, time.Duration, error) {
	sctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	n := len(hosts)
	start := time.Now()
	var (
		held, failed atomic.Int64
		firstMu      sync.Mutex
		firstErr     error
	)
	err := parallel(sctx, n*(to-from), simSetupWorkers, func(k int) error {
		i, j := k%n, from+k/n
		if _, err := hosts[i].e.Acquire(sctx, gcsRequest(fmt.Sprintf("s%d/h%d-k%d", j%simParents, i, j), j+1, true)); err != nil {
			if sctx.Err() != nil {
				return err
			}
			failed.Add(1)
			firstMu.Lock()
			if firstErr == nil {
				firstErr = fmt.Errorf("host %d lock %d: %w", i, j, err)
			}
			firstMu.Unlock()
			return nil
		}
		held.Add(1)
		return nil
	})
	if err == nil && firstErr != nil {
		err = fmt.Errorf("%d acquires failed, the first: %w", failed.Load(), firstErr)
	}
	return held.Load(), time.Since(start), err
}

// simSteady counts the requests reaching the proxy for dur and returns
// them per second, by kind.
func simSteady(ctx context.Context, p *countingProxy, dur time.Duration) (map[faultproxy.Kind]float64, error) {
	p.ResetTraffic()
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(dur):
	}
	secs := time.Since(t0).Seconds()
	out := make(map[faultproxy.Kind]float64)
	for k, c := range p.Kinds() {
		out[k] = float64(c) / secs
	}
	return out, nil
}

// simMix describes the request mix of a steady period and the setup time.
func simMix(mix map[faultproxy.Kind]float64, setup time.Duration) string {
	return fmt.Sprintf("reads %s/s, metadata %s/s, lists %s/s; setup %s s", fmtNum(mix[faultproxy.KindRead]),
		fmtNum(mix[faultproxy.KindMetadata]), fmtNum(mix[faultproxy.KindList]), fmtNum(setup.Seconds()))
}
