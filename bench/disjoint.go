package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// disjoint: P processes each looping flock EX+UN on a lock of its own
// (distinct directories at depth 4 sharing their ancestors), for P in
// Config.DisjointProcs, through lockfs and through the no-op daemon.
//
// Keys, for each P: disjoint_Pp_pairs_per_s (total over the processes),
// noop_disjoint_Pp_pairs_per_s, disjoint_Pp_ratio_vs_noop; and
// disjoint_scaling_maxp_vs_1p (lockfs throughput at the largest P over 1).
func (r *runner) disjoint(ctx context.Context) error {
	if err := r.mainMounts(ctx); err != nil {
		return err
	}
	maxP := 0
	for _, p := range r.cfg.DisjointProcs {
		maxP = max(maxP, p)
	}
	ctls := make([]string, maxP)
	for i := range ctls {
		c, err := r.lockDir(fmt.Sprintf("disjoint/p%d/c/d", i))
		if err != nil {
			return err
		}
		ctls[i] = c
	}
	noops := make([]string, maxP)
	for i := range noops {
		noops[i] = r.noopFile()
	}
	medians := map[int]float64{}
	for _, p := range r.cfg.DisjointProcs {
		var lfs, noop []float64
		for rep := 0; rep < r.cfg.Reps; rep++ {
			var a, b float64
			err := alternate(rep, func() (err error) {
				a, err = r.throughput(ctx, ctls[:p])
				return err
			}, func() (err error) {
				b, err = r.throughput(ctx, noops[:p])
				return err
			})
			if err != nil {
				return err
			}
			lfs, noop = append(lfs, a), append(noop, b)
		}
		sl, sn, rn := summarize(lfs), summarize(noop), summarize(ratios(lfs, noop))
		key := fmt.Sprintf("disjoint_%dp", p)
		r.res.setSummary(key+"_pairs_per_s", sl)
		r.res.setSummary("noop_"+key+"_pairs_per_s", sn)
		r.res.setSummary(key+"_ratio_vs_noop", rn)
		medians[p] = sl.Med
		r.logf("disjoint %dp: lockfs %.0f/s no-op %.0f/s", p, sl.Med, sn.Med)
		r.res.addRow(Row{fmt.Sprintf("disjoint locks, %d process(es): pairs/s vs no-op", p), fmtSummary(sl, "/s"), fmtSummary(sn, "/s"), fmtSummary(rn, ""), "", ""})
	}
	if one, ok := medians[1]; ok && maxP > 1 {
		r.res.set("disjoint_scaling_maxp_vs_1p", medians[maxP]/one)
	}
	return nil
}

// throughput runs one loadgen per file, all starting at the same instant,
// and returns the total pairs per second.
func (r *runner) throughput(ctx context.Context, files []string) (float64, error) {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	start := ts.Nano() + (300 * time.Millisecond).Nanoseconds()
	dur := r.cfg.DisjointDur
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total float64
		first error
	)
	for _, f := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out struct{ Ops float64 }
			err := runJSON(ctx, &out, r.bin(binLoadgen), "disjoint", "-file", f,
				"-start", fmt.Sprint(start), "-dur", dur.String())
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			total += out.Ops
		}()
	}
	wg.Wait()
	if first != nil {
		return 0, first
	}
	return total / dur.Seconds(), nil
}
