package bench

import (
	"context"
	"path/filepath"
)

// lockPair: flock EX+UN on an open control descriptor at depth 4, through
// lockfs (local backend), through the no-op daemon, and on a tmpfs file.
//
// The same pair on the root's control file (depth 0, where a lock is one
// backend claim instead of five) shows what the depth costs.
//
// Keys: lock_pair_us, noop_fuse_lock_pair_us, kernel_lock_pair_us (medians
// over repetitions, with _min and _max), lock_pair_ratio_vs_noop (median of
// the per-repetition ratios lockfs/no-op), lock_pair_ratio_vs_kernel,
// lock_pair_depth0_us, lock_pair_depth0_ratio_vs_noop.
func (r *runner) lockPair(ctx context.Context) error {
	if err := r.mainMounts(ctx); err != nil {
		return err
	}
	ctl, err := r.lockDir("a/b/c/d")
	if err != nil {
		return err
	}
	kern, err := r.kernelFile("pair")
	if err != nil {
		return err
	}
	n := itoa(r.cfg.PairOps)
	kn := itoa(max(r.cfg.PairOps*100, 1000))     // the kernel pair is ~1µs: run longer
	root := filepath.Join(r.lockfs.dir, ".lock") // depth 0: one backend claim, not five
	var lfs, noop, kernel, lfs0 []float64
	for rep := 0; rep < r.cfg.Reps; rep++ {
		var a, b float64
		err := alternate(rep, func() (err error) {
			a, err = r.nsPerOp(ctx, "pair", "-file", ctl, "-n", n)
			return err
		}, func() (err error) {
			b, err = r.nsPerOp(ctx, "pair", "-file", r.noopFile(), "-n", n)
			return err
		})
		if err != nil {
			return err
		}
		k, err := r.nsPerOp(ctx, "pair", "-file", kern, "-n", kn)
		if err != nil {
			return err
		}
		z, err := r.nsPerOp(ctx, "pair", "-file", root, "-n", n)
		if err != nil {
			return err
		}
		lfs, noop, kernel, lfs0 = append(lfs, a/1e3), append(noop, b/1e3), append(kernel, k/1e3), append(lfs0, z/1e3)
		r.logf("lockpair rep %d: lockfs %.1fµs no-op %.1fµs kernel %.2fµs lockfs depth 0 %.1fµs", rep, a/1e3, b/1e3, k/1e3, z/1e3)
	}
	sl, sn, sk := summarize(lfs), summarize(noop), summarize(kernel)
	rn, rk := summarize(ratios(lfs, noop)), summarize(ratios(lfs, kernel))
	r.res.setSummary("lock_pair_us", sl)
	r.res.setSummary("noop_fuse_lock_pair_us", sn)
	r.res.setSummary("kernel_lock_pair_us", sk)
	r.res.setSummary("lock_pair_ratio_vs_noop", rn)
	r.res.setSummary("lock_pair_ratio_vs_kernel", rk)
	g := atMost(1.15)
	gt, met := r.res.met("lock_pair_ratio_vs_noop", &g)
	r.res.addRow(Row{"flock EX+UN pair, depth 4 (µs) vs no-op FUSE daemon", fmtSummary(sl, "µs"), fmtSummary(sn, "µs"), fmtSummary(rn, ""), gt, met})
	s0, r0 := summarize(lfs0), summarize(ratios(lfs0, noop))
	r.res.setSummary("lock_pair_depth0_us", s0)
	r.res.setSummary("lock_pair_depth0_ratio_vs_noop", r0)
	r.res.addRow(Row{"  the same at depth 0 (root .lock) vs no-op", fmtSummary(s0, "µs"), fmtSummary(sn, "µs"), fmtSummary(r0, ""), "", ""})
	r.res.addRow(Row{"  flock EX+UN pair at depth 4 vs tmpfs file (kernel)", fmtSummary(sl, "µs"), fmtSummary(sk, "µs"), fmtSummary(rk, ""), "", ""})
	return nil
}
