package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// meta: create (open O_CREAT|O_EXCL + close), stat and unlink of a new file,
// as one cycle, through lockfs and through two mounts of go-fuse's loopback
// file system over the same SOURCE directory, in turn: one mounted with
// default_permissions, as lockfs must be (docs/SPEC.md §7), whose extra
// GETATTRs per cycle lockfs pays too, and one without, as go-fuse's example
// mounts it. The goal (at least go-fuse's speed) is held against the first,
// like with like; the second stays beside it. SOURCE is on the disk, whose
// journal adds its own noise on a shared VM; the same daemons over a
// SOURCE on tmpfs show the daemons' cost alone.
//
// Keys: meta_ops_per_s, gofuse_meta_ops_per_s,
// gofuse_default_permissions_meta_ops_per_s (cycles per second),
// meta_ops_ratio_vs_gofuse_default_permissions and meta_ops_ratio_vs_gofuse
// (lockfs/go-fuse per repetition, median); and the same with meta_tmpfs_ops
// for the SOURCE on tmpfs.
func (r *runner) meta(ctx context.Context) error {
	if err := r.mainMounts(ctx); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(r.src, "meta"), 0o755); err != nil {
		return err
	}
	dp, err := r.loopbackDefaultPermissions(ctx, "gofuse-dp", r.src)
	if err != nil {
		return err
	}
	defer dp.unmount()
	if err := r.metaPair(ctx, "meta", "disk", filepath.Join(r.lockfs.dir, "meta"), filepath.Join(r.gofuse.dir, "meta"), filepath.Join(dp.dir, "meta")); err != nil {
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
	defer lm.unmount()
	gmnt, err := r.dir("mnt", "gofuse-tmpfs")
	if err != nil {
		return err
	}
	gm, err := startMount(ctx, "loopback-tmpfs", r.logDir, gmnt, r.bin(binLoopback), shm, gmnt)
	if err != nil {
		return err
	}
	r.atClose(gm.unmount)
	defer gm.unmount()
	gdp, err := r.loopbackDefaultPermissions(ctx, "gofuse-dp-tmpfs", shm)
	if err != nil {
		return err
	}
	defer gdp.unmount()
	return r.metaPair(ctx, "meta_tmpfs", "tmpfs", filepath.Join(lm.dir, "meta"), filepath.Join(gm.dir, "meta"), filepath.Join(gdp.dir, "meta"))
}

// loopbackDefaultPermissions mounts go-fuse's loopback over src with
// default_permissions, at mnt/name.
func (r *runner) loopbackDefaultPermissions(ctx context.Context, name, src string) (*mount, error) {
	mnt, err := r.dir("mnt", name)
	if err != nil {
		return nil, err
	}
	m, err := startMount(ctx, "loopback-"+name, r.logDir, mnt, r.bin(binLoopback), "-default-permissions", src, mnt)
	if err != nil {
		return nil, err
	}
	r.atClose(m.unmount)
	return m, nil
}

// metaPair measures meta cycles in lockfsDir, gofuseDir and gofuseDPDir
// (go-fuse with default_permissions) in turn, the order rotating with the
// repetition, and records them under key_ops (meta or meta_tmpfs).
func (r *runner) metaPair(ctx context.Context, key, label, lockfsDir, gofuseDir, gofuseDPDir string) error {
	n := itoa(r.cfg.MetaOps)
	dirs := []string{lockfsDir, gofuseDir, gofuseDPDir}
	var lfs, gof, gdp []float64
	for rep := 0; rep < r.cfg.Reps; rep++ {
		perS := make([]float64, len(dirs))
		for i := range dirs {
			j := (i + rep) % len(dirs)
			ns, err := r.nsPerOp(ctx, "meta", "-dir", dirs[j], "-n", n)
			if err != nil {
				return err
			}
			perS[j] = 1e9 / ns
		}
		lfs, gof, gdp = append(lfs, perS[0]), append(gof, perS[1]), append(gdp, perS[2])
		r.logf("%s rep %d: lockfs %.0f/s go-fuse %.0f/s go-fuse with default_permissions %.0f/s", key, rep, perS[0], perS[1], perS[2])
	}
	sl, sg, sd := summarize(lfs), summarize(gof), summarize(gdp)
	rat, ratDP := summarize(ratios(lfs, gof)), summarize(ratios(lfs, gdp))
	key += "_ops"
	ratioKey, ratioDPKey := key+"_ratio_vs_gofuse", key+"_ratio_vs_gofuse_default_permissions"
	r.res.setSummary(key+"_per_s", sl)
	r.res.setSummary("gofuse_"+key+"_per_s", sg)
	r.res.setSummary("gofuse_default_permissions_"+key+"_per_s", sd)
	r.res.setSummary(ratioKey, rat)
	r.res.setSummary(ratioDPKey, ratDP)
	name := "create+stat+unlink cycles/s vs go-fuse loopback with default_permissions, SOURCE on " + label
	other := "  the same vs go-fuse loopback without default_permissions, SOURCE on " + label
	if label == "disk" {
		g := atLeast(1.0)
		gt, met := r.res.met(ratioDPKey, &g)
		r.res.addRow(Row{name, fmtSummary(sl, "/s"), fmtSummary(sd, "/s"), fmtSummary(ratDP, ""), gt, met})
	} else {
		name, other = "  "+name, "  "+other
		r.res.addRow(Row{name, fmtSummary(sl, "/s"), fmtSummary(sd, "/s"), fmtSummary(ratDP, ""), "", ""})
	}
	r.res.addRow(Row{other, fmtSummary(sl, "/s"), fmtSummary(sg, "/s"), fmtSummary(rat, ""), "", ""})
	return nil
}
