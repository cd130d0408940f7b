package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// tree: walks of a tree of Config.TreeFiles small files (100 per
// directory), cold, through lockfs and through go-fuse's loopback over the
// same SOURCE, alternately: `du -s`, `tar cf /dev/null` (GNU tar reads no
// data when writing to /dev/null: a walk with lstat of every file) and
// `rsync -a` to a copy on the local disk with nothing to copy. "Cold": the
// kernel's caches are dropped before every walk (drop_caches, which needs
// root), so that every name is looked up again through the mount. One
// tree serves every walk.
//
// Then the memory a daemon keeps for inodes the kernel forgot: lockfs's
// RSS after one more walk and drop_caches, once the kernel's FORGETs have
// arrived (RSS steady).
//
// Keys: tree_files; tree_{du,tar,rsync}_s and gofuse_tree_{du,tar,rsync}_s
// (seconds per walk), tree_{du,tar,rsync}_ratio_vs_gofuse (loopback time ÷
// lockfs time per repetition); tree_walk_ratio_vs_gofuse (the median of
// all three tools' ratios); rss_after_walk_mb, rss_after_forget_mb,
// rss_anon_after_forget_mb (RssAnon: the RSS less the binary's file-backed
// pages), gofuse_rss_after_forget_mb. Without root the keys are null and
// tree_unavailable_reason says why.
func (r *runner) tree(ctx context.Context) error {
	if err := r.mainMounts(ctx); err != nil {
		return err
	}
	keys := []string{"tree_walk_ratio_vs_gofuse", "rss_after_forget_mb"}
	if os.Geteuid() != 0 {
		for _, k := range keys {
			r.res.setNull(k)
		}
		r.res.notes["tree_unavailable_reason"] = "cold walks need root (drop_caches)"
		r.logf("tree: skipped: not root")
		return nil
	}
	for _, tool := range []string{"du", "tar", "rsync"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is missing (make deps installs it): %w", tool, err)
		}
	}
	rel := "tree"
	start := time.Now()
	if err := makeTree(filepath.Join(r.src, rel), r.cfg.TreeFiles); err != nil {
		return err
	}
	dest, err := r.dir("rsync-dest")
	if err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "rsync", "-a", filepath.Join(r.src, rel)+"/", dest+"/").CombinedOutput(); err != nil {
		return fmt.Errorf("rsync to the copy: %v: %s", err, out)
	}
	r.res.set("tree_files", float64(r.cfg.TreeFiles))
	r.logf("tree: %d files made and copied in %v", r.cfg.TreeFiles, time.Since(start).Round(time.Millisecond))

	walks := []struct {
		name string
		argv func(dir string) []string
	}{
		{"du", func(dir string) []string { return []string{"du", "-s", dir} }},
		{"tar", func(dir string) []string { return []string{"tar", "cf", "/dev/null", "-C", dir, "."} }},
		{"rsync", func(dir string) []string { return []string{"rsync", "-a", dir + "/", dest + "/"} }},
	}
	var all []float64
	for _, w := range walks {
		var lfs, gof []float64
		for rep := 0; rep < r.cfg.TreeReps; rep++ {
			var a, b float64
			err := alternate(rep, func() (err error) {
				a, err = coldWalk(ctx, w.argv(filepath.Join(r.lockfs.dir, rel)))
				return err
			}, func() (err error) {
				b, err = coldWalk(ctx, w.argv(filepath.Join(r.gofuse.dir, rel)))
				return err
			})
			if err != nil {
				return fmt.Errorf("%s: %w", w.name, err)
			}
			lfs, gof = append(lfs, a), append(gof, b)
			r.logf("tree %s rep %d: lockfs %.2fs go-fuse %.2fs", w.name, rep, a, b)
		}
		rat := ratios(gof, lfs)
		all = append(all, rat...)
		sl, sg, sr := summarize(lfs), summarize(gof), summarize(rat)
		key := "tree_" + w.name
		r.res.setSummary(key+"_s", sl)
		r.res.setSummary("gofuse_"+key+"_s", sg)
		r.res.setSummary(key+"_ratio_vs_gofuse", sr)
		r.res.addRow(Row{fmt.Sprintf("  cold %s over %d files (s), loopback time ÷ lockfs time", w.argv("DIR")[0], r.cfg.TreeFiles),
			fmtSummary(sl, "s"), fmtSummary(sg, "s"), fmtSummary(sr, ""), "", ""})
	}
	sa := summarize(all)
	r.res.setSummary("tree_walk_ratio_vs_gofuse", sa)
	g := atLeast(1.0)
	gt, met := r.res.met("tree_walk_ratio_vs_gofuse", &g)
	r.res.addRow(Row{"cold tree walks (du, tar, rsync) vs go-fuse loopback, loopback time ÷ lockfs time", "", "", fmtSummary(sa, ""), gt, met})
	return r.forgetRSS(ctx, filepath.Join(r.lockfs.dir, rel), filepath.Join(r.gofuse.dir, rel))
}

// forgetRSS records the daemons' RSS after a walk of dir and after the
// kernel forgot it.
func (r *runner) forgetRSS(ctx context.Context, lockfsDir, gofuseDir string) error {
	for _, dir := range []string{lockfsDir, gofuseDir} {
		if _, err := coldWalk(ctx, []string{"du", "-s", dir}); err != nil {
			return err
		}
	}
	walked, err := rssMB(r.lockfs.pid())
	if err != nil {
		return err
	}
	if err := dropCaches(); err != nil {
		return err
	}
	forgot, err := steadyRSS(ctx, r.lockfs.pid())
	if err != nil {
		return err
	}
	anon, err := statusMB(r.lockfs.pid(), "RssAnon:")
	if err != nil {
		return err
	}
	gofuse, err := steadyRSS(ctx, r.gofuse.pid())
	if err != nil {
		return err
	}
	r.res.set("rss_anon_after_forget_mb", anon)
	r.res.set("rss_after_walk_mb", walked)
	r.res.set("rss_after_forget_mb", forgot)
	r.res.set("gofuse_rss_after_forget_mb", gofuse)
	g := atMost(40)
	gt, met := r.res.met("rss_after_forget_mb", &g)
	r.res.addRow(Row{fmt.Sprintf("daemon RSS after a %d-file walk and drop_caches (MiB; %s right after the walk; %s of it not the binary's pages)", r.cfg.TreeFiles, fmtNum(walked), fmtNum(anon)),
		fmtNum(forgot) + " MiB", fmtNum(gofuse) + " MiB", "", gt, met})
	return nil
}

// makeTree makes n one-byte files under root, 100 per directory, 20
// directories per top-level directory. An existing tree is kept.
func makeTree(root string, n int) error {
	if _, err := os.Stat(filepath.Join(root, "done")); err == nil {
		return nil
	}
	for i := 0; i < n; i++ {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", i/2000), fmt.Sprintf("s%02d", i/100%20))
		if i%100 == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", i%100)), []byte{'x'}, 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(root, "done"), nil, 0o644)
}

// coldWalk drops the kernel's caches and times argv, in seconds.
func coldWalk(ctx context.Context, argv []string) (float64, error) {
	if err := dropCaches(); err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start).Seconds()
	if err != nil {
		return 0, fmt.Errorf("%q: %v: %s", argv, err, out)
	}
	return took, nil
}

// dropCaches drops the kernel's page, dentry and inode caches: every FUSE
// inode the kernel does not hold open is forgotten.
func dropCaches() error {
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
		return fmt.Errorf("drop_caches: %w", err)
	}
	return nil
}

// steadyRSS waits at least 3 s and until pid's RSS has not fallen for a
// second (the kernel's FORGETs and the daemon's release of memory, a
// second after them, are asynchronous), at most 15 s, and returns it.
func steadyRSS(ctx context.Context, pid int) (float64, error) {
	last, err := rssMB(pid)
	if err != nil {
		return 0, err
	}
	steady := 0
	start := time.Now()
	for deadline := start.Add(15 * time.Second); time.Now().Before(deadline) && (steady < 4 || time.Since(start) < 3*time.Second); {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		cur, err := rssMB(pid)
		if err != nil {
			return 0, err
		}
		if cur < last-0.25 {
			steady = 0
		} else {
			steady++
		}
		last = min(last, cur)
	}
	return last, nil
}
