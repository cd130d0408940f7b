package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/lockfs/lockfs/gcsbackend/gcstest"
)

var gcsHeldKeys = []string{"held_100k_rss_mb", "acquire_ratio_100k_vs_100"}

// gcsHeld: two `lockfs mount --backend gcs` daemons (default TTL) side by
// side on one emulator, one with Config.GCSHeldLocks locks held on
// distinct directories, the other with Config.HeldBase. The gcs backend
// keeps no descriptor per claim, so the holders are spread over several
// loadgen processes of at most Config.GCSHeldPerProc open control files
// each, to stay under RLIMIT_NOFILE. The daemons' resident set sizes are
// read from /proc/PID/status, and one more EX+UN pair at depth 4
// (Config.GCSHeldPairs per repetition, GCSReps repetitions, sides
// alternating) is timed on both.
//
// Keys: held_100k_rss_mb (the daemon holding GCSHeldLocks, read just
// after the pairs),
// acquire_ratio_100k_vs_100 (per repetition, median, with _min and _max);
// gcs_held_settled_rss_mb (the same daemon's RSS heldSettle later, with
// nothing asked of it meanwhile: the set-up's garbage returned),
// gcs_held_settled_daemon_cpu_s (the CPU time that daemon used meanwhile),
// gcs_held_settled_acquire_ratio (the pairs again, after that: the ratio
// without the collection and the return of the set-up's garbage that the
// first pairs may run beside),
// gcs_held_locks, gcs_held_base_rss_mb, gcs_held_idle_rss_mb,
// gcs_held_setup_s, gcs_held_setup_daemon_cpu_s (the CPU time the daemon
// holding GCSHeldLocks used for the set-up, its collector's included),
// gcs_held_setup_retries (claims the holders asked again
// after an ENOLCK, loadgen hold: a slow moment, not a failure),
// gcs_held_daemon_fds and gcs_held_base_daemon_fds (the
// daemons' open descriptors: none per held lock is the point),
// gcs_held_acquire_us, gcs_held_base_acquire_us, gcs_held_losses (holds
// the daemons logged as lost; they run with --on-lease-loss none) and
// gcs_held_holders_exited (holder processes that died meanwhile). If
// the locks cannot all be taken within GCSHeldSetup, the two main keys are
// null and held_100k_unavailable_reason says how far it got.
func (r *runner) gcsHeld(ctx context.Context) error {
	if !r.lockfsHasGCS(ctx) {
		r.nullKeys("held_100k", gcsHeldKeys, "lockfs mount has no --backend gcs")
		return nil
	}
	// The holders inherit the raised soft limit.
	lim, err := softNofileToHard()
	if err != nil {
		return err
	}
	perProc := min(r.cfg.GCSHeldPerProc, int(lim.Cur)-heldReserve)
	if perProc < 1 {
		return fmt.Errorf("RLIMIT_NOFILE %d leaves no room for holders", lim.Cur)
	}
	env, err := r.startGCS(ctx, "held_100k", gcsHeldKeys)
	if env == nil || err != nil {
		return err
	}
	defer env.close()

	want, base := r.cfg.GCSHeldLocks, r.cfg.HeldBase
	sides := []*gcsHeldSide{{name: "gcs-held-many", locks: want}, {name: "gcs-held-base", locks: base}}
	// 200,000 directories: on tmpfs where there is one, so that making
	// and removing them takes seconds, not minutes; removed when done.
	srcRoot, err := os.MkdirTemp(shmDir(r.work), "lockfs-bench-gcsheld-")
	if err != nil {
		return err
	}
	defer func() {
		if len(mountsUnder(srcRoot)) == 0 {
			os.RemoveAll(srcRoot)
		}
	}()
	setupDone := false
	defer func() { r.stopGCSHeld(sides, setupDone) }()
	for _, s := range sides {
		if err := r.mountGCSHeld(ctx, env, filepath.Join(srcRoot, s.name), s, perProc); err != nil {
			return err
		}
	}
	idle, err := rssMB(sides[0].m.pid())
	if err != nil {
		return err
	}

	// Take the locks: every holder process at once, within GCSHeldSetup.
	sctx, cancel := context.WithTimeout(ctx, r.cfg.GCSHeldSetup)
	defer cancel()
	start := time.Now()
	setupCPU := cpuMeter(sides[0].m.pid())
	if err := r.startGCSHolders(sides, perProc); err != nil {
		return err
	}
	held, retries, setupErr := r.awaitGCSHolders(sctx, sides, perProc)
	setup := time.Since(start)
	r.res.set("gcs_held_setup_s", setup.Seconds())
	cpu, cpuOK := setupCPU()
	if cpuOK {
		r.res.set("gcs_held_setup_daemon_cpu_s", cpu)
	}
	r.res.set("gcs_held_locks", float64(held))
	r.res.set("gcs_held_setup_retries", float64(retries))
	r.res.set("gcs_held_idle_rss_mb", idle)
	if fds, err := openFDs(sides[0].m.pid()); err == nil {
		r.res.set("gcs_held_daemon_fds", float64(fds))
	}
	if setupErr != nil {
		rss, _ := rssMB(sides[0].m.pid())
		r.nullKeys("held_100k", gcsHeldKeys, fmt.Sprintf("gcs backend: %d of %d locks held by the holder processes after %v (daemon RSS then %.0f MiB, %d holds lost): %v",
			held, want+base, setup.Round(time.Second), rss, countLosses(sides[0].m.log), setupErr))
		return nil
	}
	setupDone = true
	r.logf("gcs held: %d + %d locks held after %v (%d claims asked again after ENOLCK; the daemon used %.1f s of CPU)", want, base, setup.Round(time.Millisecond), retries, cpu)
	return r.measureGCSHeld(ctx, sides, idle)
}

// gcsHeldSide is one daemon of gcsHeld: its locks, mount and holders.
type gcsHeldSide struct {
	name    string
	locks   int
	m       *mount
	ctl     string
	holders []*lineProc
}

// mountGCSHeld makes side s's SOURCE src, with the directories of its
// holders (perProc locks each), and mounts it with the gcs backend.
func (r *runner) mountGCSHeld(ctx context.Context, env *gcsEnv, src string, s *gcsHeldSide, perProc int) error {
	for p := 0; p*perProc < s.locks; p++ {
		if err := makeHeldTreeAt(filepath.Join(src, fmt.Sprintf("hp%d", p)), min(perProc, s.locks-p*perProc)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(src, gcsLock), 0o755); err != nil {
		return err
	}
	mnt, err := r.dir("mnt", s.name)
	if err != nil {
		return err
	}
	s.m, err = startMount(ctx, s.name, r.logDir, mnt, r.bin(binLockfs), "mount", "--log-level", "warn",
		"--backend", "gcs", "--gcs-bucket", gcsBucket, "--gcs-prefix", s.name+"/",
		"--gcs-endpoint", gcstest.Endpoint(env.emu.url), "--host-id", s.name,
		// Not signalled: a loss whose holder has exited can signal
		// the holder's parent's process group, the harness's.
		"--on-lease-loss", "none", src, mnt)
	if err != nil {
		return err
	}
	r.atClose(s.m.unmount)
	s.ctl = filepath.Join(mnt, gcsLock, ".lock")
	return nil
}

// startGCSHolders starts every side's holder processes, perProc locks
// each.
func (r *runner) startGCSHolders(sides []*gcsHeldSide, perProc int) error {
	for _, s := range sides {
		for p := 0; p*perProc < s.locks; p++ {
			n := min(perProc, s.locks-p*perProc)
			h, err := r.startLineProc(fmt.Sprintf("%s-holder%d", s.name, p), "hold", "-root", filepath.Join(s.m.dir, fmt.Sprintf("hp%d", p)),
				"-n", itoa(n), "-fan", itoa(heldFan))
			if err != nil {
				return err
			}
			s.holders = append(s.holders, h)
		}
	}
	return nil
}

// awaitGCSHolders waits for each holder to say it holds its locks, until
// ctx ends. It returns the locks held, the claims the holders asked
// again, and the first failure.
func (r *runner) awaitGCSHolders(ctx context.Context, sides []*gcsHeldSide, perProc int) (held, retries int, err error) {
	for _, s := range sides {
		for p, h := range s.holders {
			n := min(perProc, s.locks-p*perProc)
			b, err := h.line(ctx, r.cfg.GCSHeldSetup)
			var out struct{ Held, Retries float64 }
			if err == nil {
				if jerr := json.Unmarshal(b, &out); jerr != nil || int(out.Held) != n {
					err = fmt.Errorf("holder: unexpected output %q", b)
				}
			}
			if err != nil {
				return held, retries, fmt.Errorf("%s holder %d (%d locks): %w", s.name, p, n, err)
			}
			held += n
			retries += int(out.Retries)
		}
	}
	return held, retries, nil
}

// stopGCSHeld stops the holders and the daemons, all at once. A holder
// still taking its locks (setupDone false) is killed, but a thread of it
// in a FUSE request lingers until its daemon answers or stops, so the
// daemons are stopped meanwhile, not after.
func (r *runner) stopGCSHeld(sides []*gcsHeldSide, setupDone bool) {
	stop := time.Now()
	var wg sync.WaitGroup
	for _, s := range sides {
		for _, h := range s.holders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if setupDone {
					h.stop()
				} else {
					h.kill()
				}
			}()
		}
	}
	if !setupDone {
		for _, s := range sides {
			if s.m != nil {
				wg.Add(1)
				go func() { defer wg.Done(); s.m.unmount() }()
			}
		}
	}
	wg.Wait()
	for _, s := range sides {
		if s.m != nil {
			wg.Add(1)
			go func() { defer wg.Done(); s.m.unmount() }() // safe twice
		}
	}
	wg.Wait()
	r.logf("gcs held: holders and daemons stopped in %v", time.Since(stop).Round(time.Millisecond))
}

// measureGCSHeld times the pairs beside the held locks, reads the daemons'
// figures, and records gcsHeld's keys and rows.
func (r *runner) measureGCSHeld(ctx context.Context, sides []*gcsHeldSide, idle float64) error {
	want, base := sides[0].locks, sides[1].locks
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer pcancel()
	many, few, err := r.pairsBeside(pctx, "gcs held", sides[0].ctl, sides[1].ctl, want, base, r.cfg.GCSHeldPairs, r.cfg.GCSReps)
	if err != nil {
		return err
	}
	rssMany, rssBase, err := readBoth(rssMB, sides[0].m, sides[1].m)
	if err != nil {
		return err
	}
	fdsMany, fdsBase, err := readBoth(openFDs, sides[0].m, sides[1].m)
	if err != nil {
		return err
	}
	// The daemon's RSS once it has been left alone for a while: its
	// memory limit (lockfs mount) leaves less room for garbage once it
	// stops allocating.
	idleCPU := cpuMeter(sides[0].m.pid())
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(heldSettle):
	}
	if cpu, ok := idleCPU(); ok {
		r.res.set("gcs_held_settled_daemon_cpu_s", cpu)
	}
	rssSettled, err := rssMB(sides[0].m.pid())
	if err != nil {
		return err
	}
	// The same pairs once both daemons have settled: the first ones run
	// while the set-up's garbage is collected and returned to the OS.
	sctx, scancel := context.WithTimeout(ctx, 3*time.Minute)
	defer scancel()
	manyS, fewS, err := r.pairsBeside(sctx, "gcs held, settled", sides[0].ctl, sides[1].ctl, want, base, r.cfg.GCSHeldPairs, r.cfg.GCSReps)
	if err != nil {
		return err
	}
	exited, lost := 0, 0
	for _, s := range sides {
		for _, h := range s.holders {
			if h.exited() {
				exited++
			}
		}
		lost += countLosses(s.m.log)
	}
	sm, sf, rat := summarize(many), summarize(few), summarize(ratios(many, few))
	res := r.res
	res.set("held_100k_rss_mb", rssMany)
	res.setSummary("acquire_ratio_100k_vs_100", rat)
	ratS := summarize(ratios(manyS, fewS))
	res.setSummary("gcs_held_settled_acquire_ratio", ratS)
	res.set("gcs_held_base_rss_mb", rssBase)
	res.set("gcs_held_settled_rss_mb", rssSettled)
	res.set("gcs_held_daemon_fds", float64(fdsMany))
	res.set("gcs_held_base_daemon_fds", float64(fdsBase))
	res.setSummary("gcs_held_acquire_us", sm)
	res.setSummary("gcs_held_base_acquire_us", sf)
	res.set("gcs_held_holders_exited", float64(exited))
	res.set("gcs_held_losses", float64(lost))
	r.logf("gcs held: RSS %.0f MiB with %d held (%.0f after %v more, %.0f with %d, %.0f idle); %d and %d descriptors; %d holds lost, %d holders exited",
		rssMany, want, rssSettled, heldSettle, rssBase, base, idle, fdsMany, fdsBase, lost, exited)
	rssGoal, ratioGoal := atMost(256), atMost(1.2)
	gt, met := res.met("held_100k_rss_mb", &rssGoal)
	res.addRow(Row{fmt.Sprintf("gcs daemon RSS with %d locks held (MiB) vs %d held", want, base),
		fmtNum(rssMany) + " MiB", fmt.Sprintf("%s MiB; %s MiB %v later; descriptors %d vs %d; %d holds lost", fmtNum(rssBase), fmtNum(rssSettled), heldSettle, fdsMany, fdsBase, lost), "", gt, met})
	gt, met = res.met("acquire_ratio_100k_vs_100", &ratioGoal)
	res.addRow(Row{fmt.Sprintf("gcs: one more EX+UN pair with %d held (µs) vs %d held", want, base),
		fmtSummary(sm, "µs"), fmtSummary(sf, "µs") + fmt.Sprintf("; %v later: %s vs %s, ratio %s", heldSettle, fmtSummary(summarize(manyS), "µs"), fmtSummary(summarize(fewS), "µs"), fmtSummary(ratS, "")), fmtSummary(rat, ""), gt, met})
	return nil
}

// heldSettle is how long gcsHeld leaves the daemon alone before it reads
// gcs_held_settled_rss_mb.
const heldSettle = 15 * time.Second

// shmDir is /dev/shm if it is there, else fallback.
func shmDir(fallback string) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return fallback
}

// countLosses counts the holds a daemon's log reports lost.
func countLosses(logPath string) int {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), `level=error msg="lock lost"`)
}

// readBoth reads one figure of two sides' daemons (rssMB, openFDs), the
// side holding many locks first.
func readBoth[T any](read func(pid int) (T, error), many, base *mount) (T, T, error) {
	m, err := read(many.pid())
	if err != nil {
		return m, m, err
	}
	b, err := read(base.pid())
	return m, b, err
}

// openFDs counts the descriptors process pid has open.
func openFDs(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}
