package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// heldFan is the number of locked directories per parent: held locks live
// at h/I/J with J < heldFan.
const heldFan = 1000

// heldReserve is the number of descriptors a lockfs daemon or a holder
// needs besides one per held lock.
const heldReserve = 1000

// held: two lockfs daemons side by side, one with Config.HeldLocks locks
// held on distinct directories (by one process holding that many open
// control files), the other with Config.HeldBase. The daemons' resident
// set sizes are read from /proc/PID/status, and the cost of one more
// EX+UN pair at depth 4 (sharing the root with every held lock) is
// measured on both, alternately.
//
// The local backend keeps one descriptor per held lock, so the daemon needs
// RLIMIT_NOFILE above HeldLocks. The harness raises its own limit (its
// children inherit it); where it cannot (no CAP_SYS_RESOURCE and a lower
// hard limit), it holds as many locks as the limit allows, records the
// local 100k keys as null with the reason, and adds a linear projection of
// the RSS.
//
// Keys: held_locks (locks actually held), held_rss_mb, held_base_rss_mb,
// idle_rss_mb (a fresh daemon), held_rss_kb_per_lock, held_setup_s (time
// to take them), acquire_held_us, acquire_base_held_us,
// acquire_ratio_held_vs_base (per repetition, median); and, when
// HeldLocks were held, local_held_100k_rss_mb and
// local_acquire_ratio_100k_vs_100 (else local_held_100k_rss_mb_projected
// and local_held_100k_unavailable_reason). held_100k_rss_mb and
// acquire_ratio_100k_vs_100 themselves come from the gcs backend, which
// needs no descriptor per lock (gcsHeld).
func (r *runner) held(ctx context.Context) error {
	want, base := r.cfg.HeldLocks, r.cfg.HeldBase
	n, limitNote, err := r.heldRoom(want, base)
	if err != nil {
		return err
	}
	type side struct {
		name   string
		locks  int
		src    string
		m      *mount
		ctl    string
		holder *lineProc
	}
	sides := []*side{{name: "held-many", locks: n}, {name: "held-base", locks: base}}
	for _, s := range sides {
		var err error
		if s.src, err = r.dir("src-" + s.name); err != nil {
			return err
		}
		if err := makeHeldTree(s.src, s.locks); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(s.src, "a/b/c/d"), 0o755); err != nil {
			return err
		}
		if s.m, err = r.startLockfs(ctx, s.name, s.src); err != nil {
			return err
		}
		s.ctl = filepath.Join(s.m.dir, "a/b/c/d/.lock")
	}
	idle, err := rssMB(sides[0].m.pid())
	if err != nil {
		return err
	}
	for _, s := range sides {
		start := time.Now()
		h, err := r.startHolder(ctx, filepath.Join(s.m.dir, "h"), s.locks)
		if err != nil {
			return fmt.Errorf("%s: hold %d locks: %w", s.name, s.locks, err)
		}
		s.holder = h
		if s.locks == n {
			r.res.set("held_setup_s", time.Since(start).Seconds())
		}
		r.logf("held: %s holds %d locks after %v", s.name, s.locks, time.Since(start).Round(time.Millisecond))
	}
	defer func() {
		for _, s := range sides {
			s.holder.stop()
		}
	}()
	many, few, err := r.pairsBeside(ctx, "held", sides[0].ctl, sides[1].ctl, n, base, r.cfg.PairOps, r.cfg.Reps)
	if err != nil {
		return err
	}
	rssMany, rssBase, err := readBoth(rssMB, sides[0].m, sides[1].m)
	if err != nil {
		return err
	}
	r.heldResults(heldFigures{want: want, n: n, base: base, limitNote: limitNote, idle: idle, rssMany: rssMany, rssBase: rssBase, many: many, few: few})
	return nil
}

// heldRoom raises RLIMIT_NOFILE for want held locks and returns how many
// can be held: want, or, where the limit cannot be raised that far, as
// many as the hard limit leaves room for, with the note that says so.
func (r *runner) heldRoom(want, base int) (n int, limitNote string, err error) {
	err = raiseNofile(uint64(want + heldReserve))
	if err == nil {
		return want, "", nil
	}
	lim, lerr := softNofileToHard()
	if lerr != nil {
		return 0, "", lerr
	}
	n = int(lim.Max) - heldReserve
	if n < base {
		return 0, "", fmt.Errorf("RLIMIT_NOFILE %d leaves room for %d locks, fewer than the %d of the base: %w", lim.Max, n, base, err)
	}
	limitNote = fmt.Sprintf("RLIMIT_NOFILE hard limit is %d and cannot be raised here (%v); the local backend keeps one descriptor per held lock, so one daemon can hold at most about %d: measured with %d held",
		lim.Max, err, lim.Max-100, n)
	r.logf("held: %s", limitNote)
	return n, limitNote, nil
}

// softNofileToHard raises the soft RLIMIT_NOFILE to the hard limit (the
// children started after inherit it) and returns the limits.
func softNofileToHard() (unix.Rlimit, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return lim, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			return lim, err
		}
	}
	return lim, nil
}

// heldFigures are what held measured: want locks wanted, n held beside
// base; the daemons' RSS (MiB), idle before the holders; the µs per pair
// of each repetition beside many and few locks.
type heldFigures struct {
	want, n, base          int
	limitNote              string
	idle, rssMany, rssBase float64
	many, few              []float64
}

// heldResults records held's keys and rows.
func (r *runner) heldResults(f heldFigures) {
	sm, sf := summarize(f.many), summarize(f.few)
	rat := summarize(ratios(f.many, f.few))
	perLockKB := (f.rssMany - f.rssBase) * 1024 / float64(f.n-f.base)
	r.res.set("held_locks", float64(f.n))
	r.res.set("held_base_locks", float64(f.base))
	r.res.set("held_rss_mb", f.rssMany)
	r.res.set("held_base_rss_mb", f.rssBase)
	r.res.set("idle_rss_mb", f.idle)
	r.res.set("held_rss_kb_per_lock", perLockKB)
	r.res.setSummary("acquire_held_us", sm)
	r.res.setSummary("acquire_base_held_us", sf)
	r.res.setSummary("acquire_ratio_held_vs_base", rat)
	rssGoal, ratioGoal := atMost(256), atMost(1.2)
	if f.n == f.want {
		r.res.set("local_held_100k_rss_mb", f.rssMany)
		r.res.setSummary("local_acquire_ratio_100k_vs_100", rat)
		gt, met := r.res.met("local_held_100k_rss_mb", &rssGoal)
		r.res.addRow(Row{fmt.Sprintf("local daemon RSS with %d locks held (MiB) vs %d held", f.n, f.base),
			fmtNum(f.rssMany) + " MiB", fmtNum(f.rssBase) + " MiB", "", gt, met})
		gt, met = r.res.met("local_acquire_ratio_100k_vs_100", &ratioGoal)
		r.res.addRow(Row{fmt.Sprintf("one more EX+UN pair with %d held (µs) vs %d held", f.n, f.base),
			fmtSummary(sm, "µs"), fmtSummary(sf, "µs"), fmtSummary(rat, ""), gt, met})
		return
	}
	// Fewer than wanted: the figures for `want` are unavailable.
	projected := f.rssBase + perLockKB*float64(f.want-f.base)/1024
	r.res.setNull("local_held_100k_rss_mb")
	r.res.setNull("local_acquire_ratio_100k_vs_100")
	r.res.set("local_held_100k_rss_mb_projected", projected)
	r.res.notes["local_held_100k_unavailable_reason"] = f.limitNote
	r.res.addRow(Row{fmt.Sprintf("local daemon RSS with %d locks held (MiB) vs %d held (%d unreachable: fd limit)", f.n, f.base, f.want),
		fmtNum(f.rssMany) + " MiB", fmtNum(f.rssBase) + " MiB", "", rssGoal.text + " at " + itoa(f.want), "n/a"})
	r.res.addRow(Row{fmt.Sprintf("  projected linearly to %d held (%.2f KiB per lock)", f.want, perLockKB),
		fmtNum(projected) + " MiB", "", "", rssGoal.text, "(" + projectedMet(rssGoal, projected) + ")"})
	r.res.addRow(Row{fmt.Sprintf("one more EX+UN pair with %d held (µs) vs %d held", f.n, f.base),
		fmtSummary(sm, "µs"), fmtSummary(sf, "µs"), fmtSummary(rat, ""), ratioGoal.text + " at " + itoa(f.want), "n/a"})
}

// pairsBeside times EX+UN pairs on the control files many (with nMany
// locks held beside it) and few (nFew held), pairs per repetition, the two
// sides alternating, and returns the µs per pair of each repetition.
func (r *runner) pairsBeside(ctx context.Context, what, many, few string, nMany, nFew, pairs, reps int) (a, b []float64, err error) {
	for rep := 0; rep < reps; rep++ {
		var x, y float64
		err := alternate(rep, func() (err error) {
			x, err = r.nsPerOp(ctx, "pair", "-file", many, "-n", itoa(pairs))
			return err
		}, func() (err error) {
			y, err = r.nsPerOp(ctx, "pair", "-file", few, "-n", itoa(pairs))
			return err
		})
		if err != nil {
			return nil, nil, err
		}
		a, b = append(a, x/1e3), append(b, y/1e3)
		r.logf("%s rep %d: pair with %d held %.1fµs, with %d held %.1fµs", what, rep, nMany, x/1e3, nFew, y/1e3)
	}
	return a, b, nil
}

// projectedMet says whether a projected value would meet g.
func projectedMet(g goal, v float64) string {
	if g.ok(v) {
		return "yes, projected"
	}
	return "no, projected"
}

// makeHeldTree makes SRC/h/I/J for the first n directories.
func makeHeldTree(src string, n int) error {
	return makeHeldTreeAt(filepath.Join(src, "h"), n)
}

// makeHeldTreeAt makes ROOT/I/J for the first n directories, as `loadgen
// hold -root ROOT -fan heldFan` takes them.
func makeHeldTreeAt(root string, n int) error {
	for i := 0; i < n; i++ {
		if i%heldFan == 0 {
			if err := os.MkdirAll(filepath.Join(root, itoa(i/heldFan)), 0o755); err != nil {
				return err
			}
		}
		if err := os.Mkdir(filepath.Join(root, itoa(i/heldFan), itoa(i%heldFan)), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// startHolder starts `loadgen hold` on root and waits until it holds n
// locks.
func (r *runner) startHolder(ctx context.Context, root string, n int) (*lineProc, error) {
	h, err := r.startLineProc(fmt.Sprintf("holder-%d", n), "hold", "-root", root, "-n", itoa(n), "-fan", itoa(heldFan))
	if err != nil {
		return nil, err
	}
	b, err := h.line(ctx, 10*time.Minute)
	if err != nil {
		h.stop()
		return nil, err
	}
	var out struct{ Held float64 }
	if err := json.Unmarshal(b, &out); err != nil || int(out.Held) != n {
		h.stop()
		return nil, fmt.Errorf("holder: unexpected output %q", b)
	}
	return h, nil
}
