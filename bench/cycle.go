package bench

import (
	"context"
	"fmt"
)

// cycles: open + flock(LOCK_EX) + close of the control file, through lockfs
// and through the no-op daemon (and on tmpfs for scale).
//
// Keys: cycle_per_s, noop_cycle_per_s, kernel_cycle_per_s,
// cycle_ratio_vs_noop (lockfs/no-op, per repetition, median), and
// cycle_edeadlk: how many LOCK_EX calls through lockfs failed with EDEADLK
// in the whole run (the previous cycle's release still in flight) and were
// retried.
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
	var edeadlk float64
	cycle := func(file, n string) (float64, error) {
		var out struct {
			NsPerOp float64 `json:"ns_per_op"`
			Edeadlk float64
		}
		err := runJSON(ctx, &out, r.bin(binLoadgen), "cycle", "-file", file, "-n", n)
		if file == ctl {
			edeadlk += out.Edeadlk
		}
		return out.NsPerOp, err
	}
	for rep := 0; rep < r.cfg.Reps; rep++ {
		var a, b float64
		err := alternate(rep, func() (err error) {
			a, err = cycle(ctl, n)
			return err
		}, func() (err error) {
			b, err = cycle(r.noopFile(), n)
			return err
		})
		if err != nil {
			return err
		}
		k, err := cycle(kern, itoa(max(r.cfg.CycleOps*20, 1000)))
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
	r.res.set("cycle_edeadlk", edeadlk)
	name := "open+flock+close cycles/s vs no-op FUSE daemon"
	if edeadlk > 0 {
		name += fmt.Sprintf(" (%.0f spurious EDEADLK retried)", edeadlk)
	}
	r.res.addRow(Row{name, fmtSummary(sl, "/s"), fmtSummary(sn, "/s"), fmtSummary(rn, ""), "", ""})
	return nil
}
