package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// fair: fairness across daemons (SPEC §2.7). Two lockfs daemons serve one
// SOURCE. On mount A three loops run `flock -x f/.lock sleep HOLD`
// (Config.FairHold), so A always has a waiter queued and hands the lock
// from one to the next; then `flock -x -w 60 f/.lock true` on mount B is
// timed, from its start to its exit. The reference is the same pattern on
// one kernel flock file on tmpfs, in the same run: the kernel does not
// queue waiters, so B's wait there is a race it may lose a few times. Each
// repetition starts the loops afresh and lets them run a random 3 to 4
// holds before B asks, so that B arrives at any point of a hold.
//
// Keys: fair_cross_mount_wait_ms (median, over Config.Reps waits),
// kernel_fair_wait_ms. A wait that reaches flock's 60 s bound counts as
// 60,000 ms (B starved).
func (r *runner) fair(ctx context.Context) error {
	src, err := r.dir("fairsrc", "f")
	if err != nil {
		return err
	}
	src = filepath.Dir(src)
	a, err := r.startLockfs(ctx, "fair-a", src)
	if err != nil {
		return err
	}
	b, err := r.startLockfs(ctx, "fair-b", src)
	if err != nil {
		return err
	}
	kern, err := r.kernelFile("fair")
	if err != nil {
		return err
	}
	busyA, waiterB := filepath.Join(a.dir, "f", ".lock"), filepath.Join(b.dir, "f", ".lock")
	var lfs, kernel []float64
	for rep := 0; rep < r.cfg.Reps; rep++ {
		var l, k float64
		err := alternate(rep, func() (err error) {
			l, err = r.fairWait(ctx, busyA, waiterB)
			return err
		}, func() (err error) {
			k, err = r.fairWait(ctx, kern, kern)
			return err
		})
		if err != nil {
			return err
		}
		lfs, kernel = append(lfs, l), append(kernel, k)
		r.logf("fair rep %d: lockfs mount B waited %.0f ms, kernel %.0f ms", rep, l, k)
	}
	sl, sk := summarize(lfs), summarize(kernel)
	r.res.setSummary("fair_cross_mount_wait_ms", sl)
	r.res.setSummary("kernel_fair_wait_ms", sk)
	g := atMost(500)
	gt, met := r.res.met("fair_cross_mount_wait_ms", &g)
	r.res.addRow(Row{fmt.Sprintf("wait on mount B while mount A of the same SOURCE is always busy (ms; holds of %v) vs one kernel flock file", r.cfg.FairHold),
		fmtSummary(sl, "ms"), fmtSummary(sk, "ms"), fmtSummary(summarize(ratios(lfs, kernel)), ""), gt, met})
	return nil
}

// fairWaitBound is flock -w's bound on the timed wait, in seconds.
const fairWaitBound = 60

// fairWait starts three loops that take busy exclusively for
// Config.FairHold each, lets them run 3 to 4 holds, and returns how long
// `flock -x -w 60 waiter true` took, in ms.
func (r *runner) fairWait(ctx context.Context, busy, waiter string) (float64, error) {
	hold := r.cfg.FairHold
	script := fmt.Sprintf(`while :; do flock -x "$1" sleep %.3f; done`, hold.Seconds())
	for range 3 {
		cmd := exec.Command("sh", "-c", script, "sh", busy)
		// Holders run in a session of their own, and die with the harness.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		defer func() {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			cmd.Wait()
		}()
	}
	select {
	case <-time.After(3*hold + rand.N(hold)):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	cmd := exec.CommandContext(ctx, "flock", "-x", "-w", itoa(fairWaitBound), waiter, "true")
	cmd.Stderr = os.Stderr
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.ExitCode() == 1 && took >= fairWaitBound*time.Second:
		r.logf("fair: %s starved: flock -w %d timed out", waiter, fairWaitBound)
	default:
		return 0, fmt.Errorf("flock -x -w %d %s true: %w", fairWaitBound, waiter, err)
	}
	return float64(took) / float64(time.Millisecond), nil
}
