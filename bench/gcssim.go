package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/lockfs/lockfs/gcsbackend/gcstest"
)

// simKeys are the goal keys of gcssim.
var simKeys = []string{"gcs_sim_1000_hosts_writes_per_s", "gcs_sim_1000_hosts_losses", "gcs_sim_1000_hosts_class_a_per_s",
	"gcs_usd_per_host_month_idle", "gcs_usd_per_host_month_churning"}

// simParents is the number of shared parents the sim's locks live under.
const simParents = 4

// GCS list prices used for the fleet's cost (docs/BENCHMARKS.md, "What a
// fleet pays", says of which date and how to redo the sum): Class A
// (uploads, listings) and Class B (reads), in USD per request; deletes
// are free.
const (
	usdPerClassA = 0.005 / 1000
	usdPerClassB = 0.0004 / 1000
	secPerMonth  = 30 * 24 * 3600
)

// gcsSim (make bench-scale): Config.GCSSimHosts hosts, each a backend with
// its own session and storage client and an engine (default TTL), spread
// over Config.GCSSimProcs helper processes (simhosts.go), each taking
// Config.GCSSimLocks exclusive locks "s<j%4>/h<i>-k<j>" (every host's locks
// under the same few parents) within Config.GCSSimSetup; then they hold
// them for Config.GCSSimDur while their backends count the requests they
// send (gcsbackend.Stats: no proxy stands between a thousand clients and
// the emulator) (the idle fleet); then, every
// Config.GCSSimChurnEvery for Config.GCSSimChurnDur, every host releases
// its locks and takes them again half a period later, nobody else wanting
// them, counted the same way (the churning fleet); then they close, a few hosts at a time per
// process.
//
// Keys: gcs_sim_1000_hosts_writes_per_s (idle), gcs_sim_1000_hosts_losses
// (holds lost from the first acquire to the end of the churn),
// gcs_sim_1000_hosts_class_a_per_s (idle writes and lists),
// gcs_sim_{reads,lists,deletes}_per_s (idle), gcs_sim_churn_{writes,
// reads,lists,deletes}_per_s, gcs_sim_churn_cycles, gcs_sim_setup_s,
// gcs_sim_close_s, gcs_sim_hosts, gcs_sim_locks, gcs_sim_procs; and what a
// host pays a month at GCS list prices, from the counted requests:
// gcs_usd_per_host_month_idle and gcs_usd_per_host_month_churning. If the
// locks are not all held by the end of the setup, the keys are null and
// gcs_sim_unavailable_reason says how far it got; each process logs its
// progress every 30 s meanwhile.
func (r *runner) gcsSim(ctx context.Context) error {
	bin, err := emulatorBinary(ctx, r.modDir)
	if err != nil {
		r.nullKeys("gcs_sim", simKeys, fmt.Sprintf("cannot build the GCS emulator %s: %v", benchEmulator, err))
		return nil
	}
	emu, err := startEmulator(ctx, bin, r.logDir, gcsBucket)
	if err != nil {
		return err
	}
	defer emu.stop(time.Second)
	n, per, nproc := r.cfg.GCSSimHosts, r.cfg.GCSSimLocks, min(r.cfg.GCSSimProcs, r.cfg.GCSSimHosts)
	res := r.res
	res.set("gcs_sim_hosts", float64(n))
	res.set("gcs_sim_locks", float64(n*per))
	res.set("gcs_sim_procs", float64(nproc))

	procs, err := r.startSims("gcs-sim", simSpec{backend: "gcs", endpoint: gcstest.Endpoint(emu.url), bucket: gcsBucket,
		prefix: "sim/", locks: per}, n, nproc)
	if err != nil {
		return err
	}
	defer procs.kill()
	setup, ok := procs.take(ctx, r, "gcs_sim", simKeys, n*per, r.cfg.GCSSimSetup)
	res.set("gcs_sim_setup_s", setup.Seconds())
	if !ok {
		return nil
	}

	// The idle fleet, then the churning one, counted by the hosts.
	idle, _, err := procs.window(ctx, func() error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(r.cfg.GCSSimDur):
			return nil
		}
	})
	if err != nil {
		return err
	}
	var churn []float64
	churnMix, secs, err := procs.window(ctx, func() error {
		var err error
		churn, err = procs.askAll(ctx, fmt.Sprintf("churn %v %v", r.cfg.GCSSimChurnDur, r.cfg.GCSSimChurnEvery), "churned")
		return err
	})
	if err != nil {
		return err
	}
	lost, closeS, err := procs.close(ctx)
	if err != nil {
		return err
	}

	r.gcsSimResults(gcsSimFigures{n: n, per: per, nproc: nproc, setup: setup, idle: idle, churnMix: churnMix,
		churn: churn, churnS: secs, lost: lost, closeS: closeS})
	return nil
}

// gcsSimFigures are what gcsSim measured.
type gcsSimFigures struct {
	n, per, nproc        int           // hosts, locks per host, processes
	setup                time.Duration // to take every lock
	idle, churnMix       requests      // per second, idle and churning
	churn                []float64     // the churn's answer: cycles (all processes), failed
	churnS, lost, closeS float64       // the churn's seconds, holds lost, the close's seconds
}

// gcsSimResults records gcsSim's keys and rows.
func (r *runner) gcsSimResults(f gcsSimFigures) {
	res := r.res
	usd := func(m requests) float64 {
		return (m.classA()*usdPerClassA + m.reads*usdPerClassB) * secPerMonth / float64(f.n)
	}
	res.set("gcs_sim_1000_hosts_writes_per_s", f.idle.writes)
	res.set("gcs_sim_1000_hosts_losses", f.lost)
	res.set("gcs_sim_1000_hosts_class_a_per_s", f.idle.classA())
	res.set("gcs_sim_reads_per_s", f.idle.reads)
	res.set("gcs_sim_lists_per_s", f.idle.lists)
	res.set("gcs_sim_deletes_per_s", f.idle.deletes)
	res.set("gcs_sim_churn_writes_per_s", f.churnMix.writes)
	res.set("gcs_sim_churn_reads_per_s", f.churnMix.reads)
	res.set("gcs_sim_churn_lists_per_s", f.churnMix.lists)
	res.set("gcs_sim_churn_deletes_per_s", f.churnMix.deletes)
	res.set("gcs_sim_churn_cycles", f.churn[0]/float64(f.nproc))
	res.set("gcs_sim_close_s", f.closeS)
	res.set("gcs_usd_per_host_month_idle", usd(f.idle))
	res.set("gcs_usd_per_host_month_churning", usd(f.churnMix))
	r.logf("gcs sim: idle %v: %s; churning %.1fs: %s (%.0f failed); closed in %.1fs; %.0f holds lost",
		r.cfg.GCSSimDur, f.idle, f.churnS, f.churnMix, f.churn[1], f.closeS, f.lost)

	what := fmt.Sprintf("%d hosts × %d locks in %d processes, default TTL, %v steady", f.n, f.per, f.nproc, r.cfg.GCSSimDur)
	for _, k := range []struct {
		name, key, ref string
		g              goal
	}{
		{"GCS sim: writes/s sent to GCS, " + what, "gcs_sim_1000_hosts_writes_per_s", fmt.Sprintf("%s; setup %s s", f.idle, fmtNum(f.setup.Seconds())), atMost(150)},
		{"GCS sim: holds lost (setup to close)", "gcs_sim_1000_hosts_losses", fmt.Sprintf("closed in %s s", fmtNum(f.closeS)), equal(0)},
		{"GCS sim: Class A requests/s (writes, lists)", "gcs_sim_1000_hosts_class_a_per_s", "", atMost(120)},
		{"GCS: USD per host-month, idle (100 held, list prices of 2026-12-03)", "gcs_usd_per_host_month_idle", "fleet: " + f.idle.String(), atMost(2)},
		{fmt.Sprintf("GCS: USD per host-month, churning (every %v all released, taken again %v later)", r.cfg.GCSSimChurnEvery, r.cfg.GCSSimChurnEvery/2),
			"gcs_usd_per_host_month_churning", "fleet: " + f.churnMix.String(), atMost(2)},
	} {
		v, _ := res.Value(k.key)
		gt, met := res.met(k.key, &k.g)
		res.addRow(Row{k.name, fmtNum(v), k.ref, "", gt, met})
	}
}

// window runs run and returns the requests per second the hosts' backends
// counted meanwhile, and how many seconds it ran.
func (p simProcs) window(ctx context.Context, run func() error) (requests, float64, error) {
	counts := func() (requests, error) {
		f, err := p.askAll(ctx, "stats", "stats")
		if err != nil {
			return requests{}, err
		}
		return requests{f[0], f[1], f[2], f[3]}, nil
	}
	c0, err := counts()
	if err != nil {
		return requests{}, 0, err
	}
	t0 := time.Now()
	if err := run(); err != nil {
		return requests{}, 0, err
	}
	secs := time.Since(t0).Seconds()
	c1, err := counts()
	if err != nil {
		return requests{}, 0, err
	}
	return c1.sub(c0).per(secs), secs, nil
}

// requests are GCS requests by kind, counted by the hosts' backends, or
// their rates.
type requests struct{ reads, writes, lists, deletes float64 }

func (c requests) sub(d requests) requests {
	return requests{c.reads - d.reads, c.writes - d.writes, c.lists - d.lists, c.deletes - d.deletes}
}

func (c requests) per(secs float64) requests {
	return requests{c.reads / secs, c.writes / secs, c.lists / secs, c.deletes / secs}
}

// classA is what GCS bills as Class A: uploads and listings (deletes are
// free).
func (c requests) classA() float64 { return c.writes + c.lists }

func (c requests) String() string {
	return fmt.Sprintf("writes %s/s, lists %s/s, reads %s/s, deletes %s/s", fmtNum(c.writes), fmtNum(c.lists), fmtNum(c.reads), fmtNum(c.deletes))
}
