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
// alternately, with a fresh file on each side in each repetition.
//
//   - write: create, write, fsync, close (the data is on disk when the clock
//     stops). Key seq_write_ratio_vs_backing; without the fsync (data in
//     the page cache only): seq_write_buffered_ratio_vs_backing.
//   - read: a file written on SOURCE, fsynced and dropped from the page
//     cache (posix_fadvise DONTNEED), read to its end: both sides read from
//     the disk. Key seq_read_ratio_vs_backing. Read again with SOURCE's
//     pages cached (lockfs does not keep its own page cache across opens):
//     seq_read_warm_ratio_vs_backing.
//
// Every ratio is lockfs MB/s / SOURCE MB/s per repetition, median; the
// MB/s figures are seq_{read,write}_mb_s and backing_seq_{read,write}_mb_s
// (and the _buffered and _warm variants).
func (r *runner) seq(ctx context.Context) error {
	if err := r.mainMounts(ctx); err != nil {
		return err
	}
	dir, err := r.dir("src", "seq")
	if err != nil {
		return err
	}
	mdir := filepath.Join(r.lockfs.dir, "seq")
	size := fmt.Sprint(r.cfg.SeqBytes)
	rate := func(args ...string) (float64, error) {
		var out struct {
			MBPerS float64 `json:"mb_per_s"`
		}
		err := runJSON(ctx, &out, r.bin(binLoadgen), args...)
		return out.MBPerS, err
	}
	type series struct{ lfs, src []float64 }
	var wr, wrBuf, rdCold, rdWarm series
	pair := func(s *series, rep int, a, b func() (float64, error)) error {
		var x, y float64
		err := alternate(rep, func() (err error) {
			x, err = a()
			return err
		}, func() (err error) {
			y, err = b()
			return err
		})
		s.lfs, s.src = append(s.lfs, x), append(s.src, y)
		return err
	}
	for rep := 0; rep < r.cfg.Reps; rep++ {
		name := func(kind, side string) string { return fmt.Sprintf("%s-%s-%d", kind, side, rep) }
		// Durable writes.
		err := pair(&wr, rep, func() (float64, error) {
			return rate("write", "-file", filepath.Join(mdir, name("w", "m")), "-size", size, "-fsync")
		}, func() (float64, error) {
			return rate("write", "-file", filepath.Join(dir, name("w", "d")), "-size", size, "-fsync")
		})
		if err != nil {
			return err
		}
		// Buffered writes.
		err = pair(&wrBuf, rep, func() (float64, error) {
			return rate("write", "-file", filepath.Join(mdir, name("b", "m")), "-size", size)
		}, func() (float64, error) {
			return rate("write", "-file", filepath.Join(dir, name("b", "d")), "-size", size)
		})
		if err != nil {
			return err
		}
		// Files to read, written on SOURCE and dropped from the cache.
		for _, side := range []string{"m", "d"} {
			p := filepath.Join(dir, name("r", side))
			if _, err := rate("write", "-file", p, "-size", size, "-fsync"); err != nil {
				return err
			}
			if err := dropCache(p); err != nil {
				return err
			}
		}
		readM := func() (float64, error) { return rate("read", "-file", filepath.Join(mdir, name("r", "m"))) }
		readD := func() (float64, error) { return rate("read", "-file", filepath.Join(dir, name("r", "d"))) }
		if err := pair(&rdCold, rep, readM, readD); err != nil {
			return err
		}
		// Warm: SOURCE's pages are cached now, on both sides.
		if err := pair(&rdWarm, rep, readM, readD); err != nil {
			return err
		}
		r.logf("seq rep %d: write %.0f/%.0f MB/s, buffered %.0f/%.0f, read cold %.0f/%.0f, warm %.0f/%.0f (lockfs/SOURCE)",
			rep, wr.lfs[rep], wr.src[rep], wrBuf.lfs[rep], wrBuf.src[rep], rdCold.lfs[rep], rdCold.src[rep], rdWarm.lfs[rep], rdWarm.src[rep])
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
		sl, ss, rat := summarize(v.s.lfs), summarize(v.s.src), summarize(ratios(v.s.lfs, v.s.src))
		r.res.setSummary(v.key+"_mb_s", sl)
		r.res.setSummary("backing_"+v.key+"_mb_s", ss)
		r.res.setSummary(v.key+"_ratio_vs_backing", rat)
		gt, met := r.res.met(v.key+"_ratio_vs_backing", v.goal)
		r.res.addRow(Row{fmt.Sprintf("%s %d MiB (MB/s) vs on SOURCE", v.label, r.cfg.SeqBytes>>20),
			fmtSummary(sl, "MB/s"), fmtSummary(ss, "MB/s"), fmtSummary(rat, ""), gt, met})
	}
	return nil
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
