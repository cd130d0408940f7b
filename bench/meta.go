package bench

import (
	"context"
	"os"
	"path/filepath"
)

// meta: create (open O_CREAT|O_EXCL + close), stat and unlink of a new file,
// as one cycle, through lockfs and through go-fuse's loopback file system
// mounted over the same SOURCE directory, alternately.
//
// Keys: meta_ops_per_s, gofuse_meta_ops_per_s (cycles per second),
// meta_ops_ratio_vs_gofuse (lockfs/go-fuse per repetition, median).
func (r *runner) meta(ctx context.Context) error {
	if err := r.mainMounts(ctx); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(r.src, "meta"), 0o755); err != nil {
		return err
	}
	n := itoa(r.cfg.MetaOps)
	var lfs, gof []float64
	for rep := 0; rep < r.cfg.Reps; rep++ {
		var a, b float64
		err := alternate(rep, func() (err error) {
			a, err = r.nsPerOp(ctx, "meta", "-dir", filepath.Join(r.lockfs.dir, "meta"), "-n", n)
			return err
		}, func() (err error) {
			b, err = r.nsPerOp(ctx, "meta", "-dir", filepath.Join(r.gofuse.dir, "meta"), "-n", n)
			return err
		})
		if err != nil {
			return err
		}
		lfs, gof = append(lfs, 1e9/a), append(gof, 1e9/b)
		r.logf("meta rep %d: lockfs %.0f/s go-fuse %.0f/s", rep, 1e9/a, 1e9/b)
	}
	sl, sg, rat := summarize(lfs), summarize(gof), summarize(ratios(lfs, gof))
	r.res.setSummary("meta_ops_per_s", sl)
	r.res.setSummary("gofuse_meta_ops_per_s", sg)
	r.res.setSummary("meta_ops_ratio_vs_gofuse", rat)
	g := atLeast(1.0)
	gt, met := r.res.met("meta_ops_ratio_vs_gofuse", &g)
	r.res.addRow(Row{"create+stat+unlink cycles/s vs go-fuse loopback", fmtSummary(sl, "/s"), fmtSummary(sg, "/s"), fmtSummary(rat, ""), gt, met})
	return nil
}
