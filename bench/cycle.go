package bench

import "context"

// cycles: open + flock(LOCK_EX) + close of the control file, through lockfs
// and through the no-op daemon (and on tmpfs for scale).
//
// Keys: cycle_per_s, noop_cycle_per_s, kernel_cycle_per_s,
// cycle_ratio_vs_noop (lockfs/no-op, per repetition, median).
func (r *runner) cycles(ctx context.Context) error {
	if err := r.mainMounts(ctx); err != nil {
		return err
	}
	ctl, err := r.lockDir("cycle/b/c/d")
	if err != nil {
		return err
	}
	kern, err := r.kernelFile("cycle")
	if err != nil {
		return err
	}
	n := itoa(r.cfg.CycleOps)
	var lfs, noop, kernel []float64
	for rep := 0; rep < r.cfg.Reps; rep++ {
		var a, b float64
		err := alternate(rep, func() (err error) {
			a, err = r.nsPerOp(ctx, "cycle", "-file", ctl, "-n", n)
			return err
		}, func() (err error) {
			b, err = r.nsPerOp(ctx, "cycle", "-file", r.noopFile(), "-n", n)
			return err
		})
		if err != nil {
			return err
		}
		k, err := r.nsPerOp(ctx, "cycle", "-file", kern, "-n", itoa(max(r.cfg.CycleOps*20, 1000)))
		if err != nil {
			return err
		}
		lfs, noop, kernel = append(lfs, 1e9/a), append(noop, 1e9/b), append(kernel, 1e9/k)
		r.logf("cycle rep %d: lockfs %.0f/s no-op %.0f/s kernel %.0f/s", rep, 1e9/a, 1e9/b, 1e9/k)
	}
	sl, sn, sk := summarize(lfs), summarize(noop), summarize(kernel)
	rn := summarize(ratios(lfs, noop))
	r.res.setSummary("cycle_per_s", sl)
	r.res.setSummary("noop_cycle_per_s", sn)
	r.res.setSummary("kernel_cycle_per_s", sk)
	r.res.setSummary("cycle_ratio_vs_noop", rn)
	r.res.addRow(Row{"open+flock+close cycles/s vs no-op FUSE daemon", fmtSummary(sl, "/s"), fmtSummary(sn, "/s"), fmtSummary(rn, ""), "", ""})
	return nil
}
