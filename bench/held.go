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
// hard limit), it holds as many locks as the limit allows, records
// held_100k_rss_mb and acquire_ratio_100k_vs_100 as null with
// held_100k_unavailable_reason, and adds a linear projection of the RSS.
//
// Keys: held_locks (locks actually held), held_rss_mb, held_base_rss_mb,
// idle_rss_mb (a fresh daemon), held_rss_kb_per_lock, held_setup_s (time
// to take them), acquire_held_us, acquire_base_held_us,
// acquire_ratio_held_vs_base (per repetition, median); and, when
// HeldLocks were held, held_100k_rss_mb and acquire_ratio_100k_vs_100
// (else held_100k_rss_mb_projected).
func (r *runner) held(ctx context.Context) error {
	want, base := r.cfg.HeldLocks, r.cfg.HeldBase
	n := want
	limitNote := ""
	if err := raiseNofile(uint64(want + heldReserve)); err != nil {
		var lim unix.Rlimit
		if gerr := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); gerr != nil {
			return gerr
		}
		if lim.Cur < lim.Max {
			lim.Cur = lim.Max
			if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
				return err
			}
		}
		n = int(lim.Max) - heldReserve
		if n < base {
			return fmt.Errorf("RLIMIT_NOFILE %d leaves room for %d locks, fewer than the %d of the base: %w", lim.Max, n, base, err)
		}
		limitNote = fmt.Sprintf("RLIMIT_NOFILE hard limit is %d and cannot be raised here (%v); the local backend keeps one descriptor per held lock, so one daemon can hold at most about %d: measured with %d held",
			lim.Max, err, lim.Max-100, n)
		r.logf("held: %s", limitNote)
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
	pairs := itoa(r.cfg.PairOps)
	var many, few []float64
	for rep := 0; rep < r.cfg.Reps; rep++ {
		var a, b float64
		err := alternate(rep, func() (err error) {
			a, err = r.nsPerOp(ctx, "pair", "-file", sides[0].ctl, "-n", pairs)
			return err
		}, func() (err error) {
			b, err = r.nsPerOp(ctx, "pair", "-file", sides[1].ctl, "-n", pairs)
			return err
		})
		if err != nil {
			return err
		}
		many, few = append(many, a/1e3), append(few, b/1e3)
		r.logf("held rep %d: pair with %d held %.1fµs, with %d held %.1fµs", rep, n, a/1e3, base, b/1e3)
	}
	rssMany, err := rssMB(sides[0].m.pid())
	if err != nil {
		return err
	}
	rssBase, err := rssMB(sides[1].m.pid())
	if err != nil {
		return err
	}
	sm, sf := summarize(many), summarize(few)
	rat := summarize(ratios(many, few))
	perLockKB := (rssMany - rssBase) * 1024 / float64(n-base)
	r.res.set("held_locks", float64(n))
	r.res.set("held_base_locks", float64(base))
	r.res.set("held_rss_mb", rssMany)
	r.res.set("held_base_rss_mb", rssBase)
	r.res.set("idle_rss_mb", idle)
	r.res.set("held_rss_kb_per_lock", perLockKB)
	r.res.setSummary("acquire_held_us", sm)
	r.res.setSummary("acquire_base_held_us", sf)
	r.res.setSummary("acquire_ratio_held_vs_base", rat)
	rssGoal, ratioGoal := atMost(256), atMost(1.2)
	if n == want {
		r.res.set("held_100k_rss_mb", rssMany)
		r.res.setSummary("acquire_ratio_100k_vs_100", rat)
		gt, met := r.res.met("held_100k_rss_mb", &rssGoal)
		r.res.addRow(Row{fmt.Sprintf("daemon RSS with %d locks held (MiB) vs %d held", n, base),
			fmtNum(rssMany) + " MiB", fmtNum(rssBase) + " MiB", "", gt, met})
		gt, met = r.res.met("acquire_ratio_100k_vs_100", &ratioGoal)
		r.res.addRow(Row{fmt.Sprintf("one more EX+UN pair with %d held (µs) vs %d held", n, base),
			fmtSummary(sm, "µs"), fmtSummary(sf, "µs"), fmtSummary(rat, ""), gt, met})
		return nil
	}
	// Fewer than wanted: the figures for `want` are unavailable.
	projected := rssBase + perLockKB*float64(want-base)/1024
	r.res.setNull("held_100k_rss_mb")
	r.res.setNull("acquire_ratio_100k_vs_100")
	r.res.set("held_100k_rss_mb_projected", projected)
	r.res.notes["held_100k_unavailable_reason"] = limitNote
	r.res.addRow(Row{fmt.Sprintf("daemon RSS with %d locks held (MiB) vs %d held (%d unreachable: fd limit)", n, base, want),
		fmtNum(rssMany) + " MiB", fmtNum(rssBase) + " MiB", "", rssGoal.text + " at " + itoa(want), "n/a"})
	r.res.addRow(Row{fmt.Sprintf("  projected linearly to %d held (%.2f KiB per lock)", want, perLockKB),
		fmtNum(projected) + " MiB", "", "", rssGoal.text, "(" + projectedMet(rssGoal, projected) + ")"})
	r.res.addRow(Row{fmt.Sprintf("one more EX+UN pair with %d held (µs) vs %d held", n, base),
		fmtSummary(sm, "µs"), fmtSummary(sf, "µs"), fmtSummary(rat, ""), ratioGoal.text + " at " + itoa(want), "n/a"})
	return nil
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
	for i := 0; i < n; i++ {
		if i%heldFan == 0 {
			if err := os.MkdirAll(filepath.Join(src, "h", itoa(i/heldFan)), 0o755); err != nil {
				return err
			}
		}
		if err := os.Mkdir(filepath.Join(src, "h", itoa(i/heldFan), itoa(i%heldFan)), 0o755); err != nil {
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
