package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// warmReads is how many cached reads each side makes per repetition.
const warmReads = 5

// seq: sequential write and read of a Config.SeqBytes file (1 MiB per
// system call) through the lockfs mount (FUSE passthrough on, its default
// as root) and on SOURCE directly, alternately, with a fresh file on each
// side in each repetition; then the same through go-fuse's loopback over
// the same SOURCE, with the kernel's FUSE passthrough (go-fuse's default as
// root on Linux >= 6.9) and without it (-no-passthrough: every read and
// write is a FUSE request), and through lockfs with --passthrough=off, to
// tell lockfs's own cost from the transport's.
//
//   - write: create, write, fsync, close (the data is on disk when the clock
//     stops). Key seq_write_ratio_vs_backing; without the fsync (data in
//     the page cache only): seq_write_buffered_ratio_vs_backing.
//   - read: a file written on SOURCE, fsynced and dropped from the page
//     cache (posix_fadvise DONTNEED), read to its end: both sides read from
//     the disk. Key seq_read_ratio_vs_backing. Read again, the second read
//     of the file, with SOURCE's pages cached (passthrough reads them;
//     without it a FUSE file system without keep_cache drops its own page
//     cache on open): cached_read_ratio_vs_backing (also under its old name
//     seq_read_warm_ratio_vs_backing), each side's figure the median of
//     warmReads reads in a row.
//   - without passthrough: lockfs --passthrough=off against go-fuse
//     -no-passthrough, seq_write_nopt_ratio_vs_gofuse_nopt and
//     seq_read_nopt_ratio_vs_gofuse_nopt (MB/s: seq_*_nopt_mb_s).
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
	if err := r.noPassthroughMounts(ctx); err != nil {
		return err
	}
	dir, err := r.dir("src", "seq")
	if err != nil {
		return err
	}
	sides := []string{filepath.Join(r.lockfs.dir, "seq"), dir, filepath.Join(r.gofuse.dir, "seq"), filepath.Join(r.gofuseNoPT.dir, "seq"), filepath.Join(r.lockfsNoPT.dir, "seq")}
	var f seqFigures
	for rep := 0; rep < r.cfg.Reps; rep++ {
		if err := r.seqRep(ctx, dir, sides, rep, &f); err != nil {
			return err
		}
	}
	r.seqResults(&f)
	return nil
}

// seqSeries holds lockfs, SOURCE, go-fuse, go-fuse without passthrough
// and lockfs without passthrough figures, one per repetition.
type seqSeries [5][]float64

// seqFigures are seq's four measurements.
type seqFigures struct {
	wr, wrBuf, rdCold, rdWarm seqSeries
}

// step measures fn on each side and appends the figures to s: lockfs and
// SOURCE alternately, then go-fuse with passthrough, then go-fuse and
// lockfs without passthrough alternately (the two sides of the *_nopt
// ratios).
func (s *seqSeries) step(rep int, fn func(side int) (float64, error)) error {
	var x [5]float64
	side := func(i int) func() error {
		return func() (err error) {
			x[i], err = fn(i)
			return err
		}
	}
	if err := alternate(rep, side(0), side(1)); err != nil {
		return err
	}
	if err := side(2)(); err != nil {
		return err
	}
	if err := alternate(rep, side(3), side(4)); err != nil {
		return err
	}
	for i := range x {
		s[i] = append(s[i], x[i])
	}
	return nil
}

// seqRep is repetition rep of seq: the writes, with and without fsync,
// and the reads, not cached and cached, on every side (sides; dir is
// SOURCE's side). It frees the disk when done.
func (r *runner) seqRep(ctx context.Context, dir string, sides []string, rep int, f *seqFigures) error {
	size := fmt.Sprint(r.cfg.SeqBytes)
	rate := func(args ...string) (float64, error) {
		var out struct {
			MBPerS float64 `json:"mb_per_s"`
		}
		err := runJSON(ctx, &out, r.bin(binLoadgen), args...)
		return out.MBPerS, err
	}
	name := func(kind string, side int) string { return fmt.Sprintf("%s-%d-%d", kind, side, rep) }
	err := f.wr.step(rep, func(i int) (float64, error) {
		return rate("write", "-file", filepath.Join(sides[i], name("w", i)), "-size", size, "-fsync")
	})
	if err != nil {
		return err
	}
	err = f.wrBuf.step(rep, func(i int) (float64, error) {
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
	if err := f.rdCold.step(rep, read); err != nil {
		return err
	}
	// A cached read of 256 MiB takes 15-30 ms, so one reading per
	// side moves with whatever else the VM does in those
	// milliseconds: each side reads its cached file warmReads times
	// in a row and counts the median.
	warm := func(i int) (float64, error) {
		xs := make([]float64, 0, warmReads)
		for range warmReads {
			x, err := read(i)
			if err != nil {
				return 0, err
			}
			xs = append(xs, x)
		}
		return summarize(xs).Med, nil
	}
	if err := f.rdWarm.step(rep, warm); err != nil {
		return err
	}
	at := func(s seqSeries) string {
		return fmt.Sprintf("%.0f/%.0f/%.0f/%.0f/%.0f", s[0][rep], s[1][rep], s[2][rep], s[3][rep], s[4][rep])
	}
	r.logf("seq rep %d (MB/s, lockfs/SOURCE/go-fuse/go-fuse without passthrough/lockfs without passthrough): write %s, buffered %s, read cold %s, warm %s",
		rep, at(f.wr), at(f.wrBuf), at(f.rdCold), at(f.rdWarm))
	// Free the disk before the next repetition.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		os.Remove(filepath.Join(dir, e.Name()))
	}
	return nil
}

// seqResults records seq's keys and rows.
func (r *runner) seqResults(f *seqFigures) {
	g, gc, gn := atLeast(0.9), atLeast(0.8), atLeast(1.5)
	wr, wrBuf, rdCold, rdWarm := f.wr, f.wrBuf, f.rdCold, f.rdWarm
	for _, v := range []struct {
		key, label string
		s          seqSeries
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
	// The cached reads of the file, under their own key.
	cached := summarize(ratios(rdWarm[0], rdWarm[1]))
	r.res.setSummary("cached_read_ratio_vs_backing", cached)
	gt, met := r.res.met("cached_read_ratio_vs_backing", &gc)
	r.res.addRow(Row{fmt.Sprintf("cached read of a %d MiB file, median of %d (MB/s) vs on SOURCE", r.cfg.SeqBytes>>20, warmReads),
		fmtSummary(summarize(rdWarm[0]), "MB/s"), fmtSummary(summarize(rdWarm[1]), "MB/s"), fmtSummary(cached, ""), gt, met})
	// lockfs without passthrough against go-fuse without passthrough.
	for _, v := range []struct {
		key, label string
		s          seqSeries
	}{
		{"seq_write_nopt", "sequential write + fsync", wr},
		{"seq_read_nopt", "sequential read, not cached", rdCold},
	} {
		sl, sn := summarize(v.s[4]), summarize(v.s[3])
		rat := summarize(ratios(v.s[4], v.s[3]))
		r.res.setSummary(v.key+"_mb_s", sl)
		r.res.setSummary(v.key+"_ratio_vs_gofuse_nopt", rat)
		gt, met := r.res.met(v.key+"_ratio_vs_gofuse_nopt", &gn)
		r.res.addRow(Row{fmt.Sprintf("%s %d MiB, lockfs --passthrough=off vs go-fuse loopback -no-passthrough", v.label, r.cfg.SeqBytes>>20),
			fmtSummary(sl, "MB/s"), fmtSummary(sn, "MB/s"), fmtSummary(rat, ""), gt, met})
	}
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
