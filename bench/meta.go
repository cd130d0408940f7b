package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// meta: create (open O_CREAT|O_EXCL + close), stat and unlink of a new file,
// as one cycle, through lockfs and through go-fuse's loopback file system
// mounted over the same SOURCE directory, alternately. SOURCE is on the
// disk, whose journal adds its own noise on a shared VM; the same pair of
// daemons over a SOURCE on tmpfs shows the daemons' cost alone.
//
// Keys: meta_ops_per_s, gofuse_meta_ops_per_s (cycles per second),
// meta_ops_ratio_vs_gofuse (lockfs/go-fuse per repetition, median); and
// meta_tmpfs_ops_per_s, gofuse_meta_tmpfs_ops_per_s,
// meta_tmpfs_ops_ratio_vs_gofuse.
func (r *runner) meta(ctx context.Context) error {
	if err := r.mainMounts(ctx); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(r.src, "meta"), 0o755); err != nil {
		return err
	}
	if err := r.metaPair(ctx, "meta", "disk", filepath.Join(r.lockfs.dir, "meta"), filepath.Join(r.gofuse.dir, "meta")); err != nil {
		return err
	}
	// The same over tmpfs.
	shm, err := os.MkdirTemp("/dev/shm", "lockfs-bench-src-")
	if err != nil {
		return fmt.Errorf("tmpfs SOURCE: %w", err)
	}
	r.atClose(func() { os.RemoveAll(shm) })
	if err := os.Mkdir(filepath.Join(shm, "meta"), 0o755); err != nil {
		return err
	}
	lm, err := r.startLockfs(ctx, "lockfs-tmpfs", shm)
	if err != nil {
		return err
	}
	gmnt, err := r.dir("mnt", "gofuse-tmpfs")
	if err != nil {
		return err
	}
	gm, err := startMount(ctx, "loopback-tmpfs", r.logDir, gmnt, r.bin(binLoopback), shm, gmnt)
	if err != nil {
		return err
	}
	r.atClose(gm.unmount)
	defer func() { lm.unmount(); gm.unmount() }()
	return r.metaPair(ctx, "meta_tmpfs", "tmpfs", filepath.Join(lm.dir, "meta"), filepath.Join(gm.dir, "meta"))
}

// metaPair measures meta cycles in lockfsDir and gofuseDir alternately and
// records them under key_ops (meta or meta_tmpfs).
func (r *runner) metaPair(ctx context.Context, key, label, lockfsDir, gofuseDir string) error {
	n := itoa(r.cfg.MetaOps)
	var lfs, gof []float64
	for rep := 0; rep < r.cfg.Reps; rep++ {
		var a, b float64
		err := alternate(rep, func() (err error) {
			a, err = r.nsPerOp(ctx, "meta", "-dir", lockfsDir, "-n", n)
			return err
		}, func() (err error) {
			b, err = r.nsPerOp(ctx, "meta", "-dir", gofuseDir, "-n", n)
			return err
		})
		if err != nil {
			return err
		}
		lfs, gof = append(lfs, 1e9/a), append(gof, 1e9/b)
		r.logf("%s rep %d: lockfs %.0f/s go-fuse %.0f/s", key, rep, 1e9/a, 1e9/b)
	}
	sl, sg, rat := summarize(lfs), summarize(gof), summarize(ratios(lfs, gof))
	key += "_ops"
	ratioKey := key + "_ratio_vs_gofuse"
	r.res.setSummary(key+"_per_s", sl)
	r.res.setSummary("gofuse_"+key+"_per_s", sg)
	r.res.setSummary(ratioKey, rat)
	name := "create+stat+unlink cycles/s vs go-fuse loopback, SOURCE on " + label
	if label == "disk" {
		g := atLeast(1.0)
		gt, met := r.res.met(ratioKey, &g)
		r.res.addRow(Row{name, fmtSummary(sl, "/s"), fmtSummary(sg, "/s"), fmtSummary(rat, ""), gt, met})
	} else {
		r.res.addRow(Row{"  " + name, fmtSummary(sl, "/s"), fmtSummary(sg, "/s"), fmtSummary(rat, ""), "", ""})
	}
	return nil
}
