package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// seq: sequential write and read of a Config.SeqBytes file (1 MiB per
// system call) through the lockfs mount and on SOURCE directly,
// alternately, with a fresh file on each side in each repetition; then the
// same through go-fuse's loopback over the same SOURCE, with the kernel's
// FUSE passthrough (go-fuse's default as root on Linux >= 6.9: reads and
// writes of an open file never reach the daemon) and without it
// (-no-passthrough: every read and write is a FUSE request, as in lockfs,
// whose bazil.org/fuse has no passthrough), to tell lockfs's own cost from
// the transport's.
//
//   - write: create, write, fsync, close (the data is on disk when the clock
//     stops). Key seq_write_ratio_vs_backing; without the fsync (data in
//     the page cache only): seq_write_buffered_ratio_vs_backing.
//   - read: a file written on SOURCE, fsynced and dropped from the page
//     cache (posix_fadvise DONTNEED), read to its end: both sides read from
//     the disk. Key seq_read_ratio_vs_backing. Read again with SOURCE's
//     pages cached (a FUSE file system without keep_cache drops its own
//     page cache on open): seq_read_warm_ratio_vs_backing.
//
// Every ratio is lockfs MB/s / SOURCE MB/s per repetition, median; the
// MB/s figures are seq_{read,write}_mb_s, backing_seq_{read,write}_mb_s
// gofuse_seq_{read,write}_mb_s and gofuse_nopt_seq_{read,write}_mb_s (and
// the _buffered and _warm variants), and the ratios to go-fuse
// *_ratio_vs_gofuse and *_ratio_vs_gofuse_nopt. The buffered files are
// fsynced after their step, off the clock, so that their writeback does not
// slow the next steps.
func (r *runner) seq(ctx context.Context) error {
	if err := r.mainMounts(ctx); err != nil {
		return err
	}
	if err := r.noPassthroughMount(ctx); err != nil {
		return err
	}
	dir, err := r.dir("src", "seq")
	if err != nil {
		return err
	}
	sides := []string{filepath.Join(r.lockfs.dir, "seq"), dir, filepath.Join(r.gofuse.dir, "seq"), filepath.Join(r.gofuseNoPT.dir, "seq")}
	size := fmt.Sprint(r.cfg.SeqBytes)
	rate := func(args ...string) (float64, error) {
		var out struct {
			MBPerS float64 `json:"mb_per_s"`
		}
		err := runJSON(ctx, &out, r.bin(binLoadgen), args...)
		return out.MBPerS, err
	}
	// series holds lockfs, SOURCE, go-fuse and go-fuse without
	// passthrough figures.
	type series [4][]float64
	var wr, wrBuf, rdCold, rdWarm series
	// step measures fn on each side: lockfs and SOURCE alternately, then
	// the two go-fuse mounts.
	step := func(s *series, rep int, fn func(side int) (float64, error)) error {
		var x [4]float64
		err := alternate(rep, func() (err error) {
			x[0], err = fn(0)
			return err
		}, func() (err error) {
			x[1], err = fn(1)
			return err
		})
		if err != nil {
			return err
		}
		for i := 2; i < len(x); i++ {
			if x[i], err = fn(i); err != nil {
				return err
			}
		}
		for i := range x {
			s[i] = append(s[i], x[i])
		}
		return nil
	}
	for rep := 0; rep < r.cfg.Reps; rep++ {
		name := func(kind string, side int) string { return fmt.Sprintf("%s-%d-%d", kind, side, rep) }
		err := step(&wr, rep, func(i int) (float64, error) {
			return rate("write", "-file", filepath.Join(sides[i], name("w", i)), "-size", size, "-fsync")
		})
		if err != nil {
			return err
		}
		err = step(&wrBuf, rep, func(i int) (float64, error) {
			return rate("write", "-file", filepath.Join(sides[i], name("b", i)), "-size", size)
		})
		if err != nil {
			return err
		}
		// Write the buffered files back, off the clock, so that their
		// writeback does not slow the next steps.
		for i := range sides {
			if err := fsyncFile(filepath.Join(dir, name("b", i))); err != nil {
				return err
			}
		}
		// Files to read, one per side, written on SOURCE and dropped from
		// the cache.
		for i := range sides {
			p := filepath.Join(dir, name("r", i))
			if _, err := rate("write", "-file", p, "-size", size, "-fsync"); err != nil {
				return err
			}
			if err := dropCache(p); err != nil {
				return err
			}
		}
		read := func(i int) (float64, error) { return rate("read", "-file", filepath.Join(sides[i], name("r", i))) }
		if err := step(&rdCold, rep, read); err != nil {
			return err
		}
		if err := step(&rdWarm, rep, read); err != nil {
			return err
		}
		r.logf("seq rep %d (MB/s, lockfs/SOURCE/go-fuse/go-fuse without passthrough): write %.0f/%.0f/%.0f/%.0f, buffered %.0f/%.0f/%.0f/%.0f, read cold %.0f/%.0f/%.0f/%.0f, warm %.0f/%.0f/%.0f/%.0f",
			rep, wr[0][rep], wr[1][rep], wr[2][rep], wr[3][rep], wrBuf[0][rep], wrBuf[1][rep], wrBuf[2][rep], wrBuf[3][rep],
			rdCold[0][rep], rdCold[1][rep], rdCold[2][rep], rdCold[3][rep], rdWarm[0][rep], rdWarm[1][rep], rdWarm[2][rep], rdWarm[3][rep])
		// Free the disk before the next repetition.
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	g := atLeast(0.7)
	for _, v := range []struct {
		key, label string
		s          series
		goal       *goal
	}{
		{"seq_write", "sequential write + fsync", wr, &g},
		{"seq_write_buffered", "sequential write, no fsync", wrBuf, nil},
		{"seq_read", "sequential read, not cached", rdCold, &g},
		{"seq_read_warm", "sequential read, SOURCE cached", rdWarm, nil},
	} {
		sl, ss, sg, sn := summarize(v.s[0]), summarize(v.s[1]), summarize(v.s[2]), summarize(v.s[3])
		rat, ratG, ratN := summarize(ratios(v.s[0], v.s[1])), summarize(ratios(v.s[0], v.s[2])), summarize(ratios(v.s[0], v.s[3]))
		r.res.setSummary(v.key+"_mb_s", sl)
		r.res.setSummary("backing_"+v.key+"_mb_s", ss)
		r.res.setSummary("gofuse_"+v.key+"_mb_s", sg)
		r.res.setSummary("gofuse_nopt_"+v.key+"_mb_s", sn)
		r.res.setSummary(v.key+"_ratio_vs_backing", rat)
		r.res.setSummary(v.key+"_ratio_vs_gofuse", ratG)
		r.res.setSummary(v.key+"_ratio_vs_gofuse_nopt", ratN)
		gt, met := r.res.met(v.key+"_ratio_vs_backing", v.goal)
		r.res.addRow(Row{fmt.Sprintf("%s %d MiB (MB/s) vs on SOURCE", v.label, r.cfg.SeqBytes>>20),
			fmtSummary(sl, "MB/s"), fmtSummary(ss, "MB/s"), fmtSummary(rat, ""), gt, met})
		r.res.addRow(Row{"  the same vs go-fuse loopback (kernel FUSE passthrough)", fmtSummary(sl, "MB/s"), fmtSummary(sg, "MB/s"), fmtSummary(ratG, ""), "", ""})
		r.res.addRow(Row{"  the same vs go-fuse loopback, no passthrough", fmtSummary(sl, "MB/s"), fmtSummary(sn, "MB/s"), fmtSummary(ratN, ""), "", ""})
	}
	return nil
}

// fsyncFile writes p's dirty pages back.
func fsyncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// dropCache writes back and drops p's pages from the page cache.
func dropCache(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return err
	}
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}
