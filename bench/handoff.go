package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// handoff: Config.HandoffProcs processes take one exclusive lock in turn;
// the hand-off latency is the time from a holder's release (just before its
// LOCK_UN) to the next holder running (just after its flock returns),
// measured on CLOCK_MONOTONIC across processes. Through lockfs every
// process blocks in LOCK_EX (FUSE LockWait); the reference is the protocol
// lockfs replaces: LOCK_EX|LOCK_NB and a Config.PollInterval sleep between
// tries, on a plain file on the same disk. A process that released asks
// again only after another was granted, so no hand-off is to oneself.
//
// The same blocking hand-off on a tmpfs file shows the floor that the
// kernel's own flock and this machine's scheduler set.
//
// Keys: handoff_p99_us, poll_handoff_p99_us, handoff_ratio_vs_poll (poll
// p99 / lockfs p99, per repetition, median), handoff_p50_us,
// poll_handoff_p50_us, kernel_handoff_p99_us, kernel_handoff_p50_us.
func (r *runner) handoff(ctx context.Context) error {
	if err := r.mainMounts(ctx); err != nil {
		return err
	}
	ctl, err := r.lockDir("handoff/b/c/d")
	if err != nil {
		return err
	}
	plainDir, err := r.dir("plain")
	if err != nil {
		return err
	}
	plain := filepath.Join(plainDir, "handoff.lock")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		return err
	}
	kern, err := r.kernelFile("handoff")
	if err != nil {
		return err
	}
	var p99, pp99, p50, pp50, k99, k50 []float64
	for rep := 0; rep < r.cfg.Reps; rep++ {
		var a, b []float64
		err := alternate(rep, func() (err error) {
			a, err = r.handoffRun(ctx, ctl, r.cfg.HandoffRounds, 0)
			return err
		}, func() (err error) {
			b, err = r.handoffRun(ctx, plain, r.cfg.PollRounds, r.cfg.PollInterval)
			return err
		})
		if err != nil {
			return err
		}
		p99, pp99 = append(p99, percentile(a, 99)), append(pp99, percentile(b, 99))
		p50, pp50 = append(p50, percentile(a, 50)), append(pp50, percentile(b, 50))
		k, err := r.handoffRun(ctx, kern, r.cfg.HandoffRounds, 0)
		if err != nil {
			return err
		}
		k99, k50 = append(k99, percentile(k, 99)), append(k50, percentile(k, 50))
		r.logf("handoff rep %d: lockfs p50 %.0fµs p99 %.0fµs (%d); poll p50 %.0fµs p99 %.0fµs (%d); kernel p50 %.0fµs p99 %.0fµs",
			rep, p50[rep], p99[rep], len(a), pp50[rep], pp99[rep], len(b), k50[rep], k99[rep])
	}
	s99, sp99 := summarize(p99), summarize(pp99)
	rat := summarize(ratios(pp99, p99))
	r.res.setSummary("handoff_p99_us", s99)
	r.res.setSummary("poll_handoff_p99_us", sp99)
	r.res.setSummary("handoff_ratio_vs_poll", rat)
	r.res.setSummary("handoff_p50_us", summarize(p50))
	r.res.setSummary("poll_handoff_p50_us", summarize(pp50))
	sk99 := summarize(k99)
	r.res.setSummary("kernel_handoff_p99_us", sk99)
	r.res.setSummary("kernel_handoff_p50_us", summarize(k50))
	g := atLeast(100)
	gt, met := r.res.met("handoff_ratio_vs_poll", &g)
	r.res.addRow(Row{fmt.Sprintf("hand-off p99, %d waiters (µs) vs 50 ms polling (ratio poll/lockfs)", r.cfg.HandoffProcs),
		fmtSummary(s99, "µs"), fmtSummary(sp99, "µs"), fmtSummary(rat, ""), gt, met})
	r.res.addRow(Row{"  hand-off p99 (µs) vs blocking flock on a tmpfs file (kernel)",
		fmtSummary(s99, "µs"), fmtSummary(sk99, "µs"), fmtSummary(summarize(ratios(p99, k99)), ""), "", ""})
	r.res.addRow(Row{"  hand-off p50 (µs) vs 50 ms polling, vs kernel",
		fmtSummary(summarize(p50), "µs"), fmtSummary(summarize(pp50), "µs") + "; kernel " + fmtSummary(summarize(k50), "µs"), "", "", ""})
	return nil
}

// handoffRun runs the hand-off processes on file and returns the hand-off
// latencies in µs. poll 0 means blocking LOCK_EX.
func (r *runner) handoffRun(ctx context.Context, file string, rounds int, poll time.Duration) ([]float64, error) {
	shm, err := os.CreateTemp(r.work, "handoff-shm-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(shm.Name())
	if err := shm.Truncate(4096); err != nil {
		shm.Close()
		return nil, err
	}
	shm.Close()

	type event struct{ Grant, Release int64 }
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		events []event
		first  error
	)
	// A waiter that never gets its turn would hang the run: bound it.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for i := 0; i < r.cfg.HandoffProcs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out struct{ Events []event }
			err := runJSON(ctx, &out, r.bin(binLoadgen), "handoff", "-file", file, "-shm", shm.Name(),
				"-procs", itoa(r.cfg.HandoffProcs), "-rounds", itoa(rounds),
				"-hold", r.cfg.HandoffHold.String(), "-poll", poll.String())
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = err
					cancel() // the others would wait for this one forever
				}
				return
			}
			events = append(events, out.Events...)
		}()
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	sort.Slice(events, func(i, j int) bool { return events[i].Grant < events[j].Grant })
	lat := make([]float64, 0, len(events))
	for i := 1; i < len(events); i++ {
		d := events[i].Grant - events[i-1].Release
		if d < 0 {
			return nil, fmt.Errorf("grant at %d before the previous holder released at %d: the lock was not exclusive",
				events[i].Grant, events[i-1].Release)
		}
		lat = append(lat, float64(d)/1e3)
	}
	return lat, nil
}
