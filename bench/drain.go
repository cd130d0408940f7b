package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// drain: a lockfs daemon of its own; a holder keeps a/.lock exclusively
// while Config.DrainWaiters waiters queue for it, each an open file
// description of its own on a thread of its own (loadgen waiters: the
// threads of one process, each taking the lock once, then closing), then
// the holder lets go and the queue drains. The reference is the same on
// one kernel flock file on tmpfs, in the same run.
//
// Keys: drain_10k_waiters_s (from the holder's release to the last grant),
// kernel_drain_waiters_s (the same on the kernel file), drain_10k_rss_mb
// (the daemon's peak RSS, VmHWM, over queueing and draining; the daemon
// runs only this measurement), drain_queued_rss_mb (its RSS once all
// were queued), drain_waiters (how many waited),
// drain_queue_s (how long they took to queue), drain_errors (lock calls
// that failed).
func (r *runner) drain(ctx context.Context) error {
	n := r.cfg.DrainWaiters
	if err := raiseNofile(uint64(n + heldReserve)); err != nil {
		r.logf("drain: %v (the waiters raise their own soft limit)", err)
	}
	src, err := r.dir("src-drain", "a")
	if err != nil {
		return err
	}
	m, err := r.startLockfs(ctx, "drain", filepath.Dir(src))
	if err != nil {
		return err
	}
	ctl := filepath.Join(m.dir, "a", ".lock")
	want := []byte(fmt.Sprintf("\nwaiters %d\n", n))
	var queuedRSS float64
	queued, drain, errs, err := r.drainOnce(ctx, "drain", ctl, n, func() bool {
		b, err := os.ReadFile(ctl)
		if err != nil || !bytes.Contains(b, want) {
			return false
		}
		queuedRSS, _ = rssMB(m.pid())
		return true
	})
	if err != nil {
		return err
	}
	rss, err := statusMB(m.pid(), "VmHWM:")
	if err != nil {
		return err
	}

	kern, err := r.kernelFile("drain")
	if err != nil {
		return err
	}
	_, kdrain, _, err := r.drainOnce(ctx, "drain-kernel", kern, n, func() bool {
		return kernelBlocked(kern) >= n
	})
	if err != nil {
		return err
	}

	res := r.res
	res.set("drain_waiters", float64(n))
	res.set("drain_queue_s", queued.Seconds())
	res.set("drain_errors", float64(errs))
	res.set("drain_10k_waiters_s", drain)
	res.set("kernel_drain_waiters_s", kdrain)
	res.set("drain_10k_rss_mb", rss)
	res.set("drain_queued_rss_mb", queuedRSS)
	r.logf("drain: %d waiters queued in %v, drained in %.2f s (kernel %.3f s), daemon RSS %.0f MiB when all were queued, peak %.0f MiB, %d errors",
		n, queued.Round(time.Millisecond), drain, kdrain, queuedRSS, rss, errs)
	drainGoal, rssGoal := atMost(10), atMost(150)
	g, met := res.met("drain_10k_waiters_s", &drainGoal)
	res.addRow(Row{fmt.Sprintf("drain of %d waiters on one lock, release to last grant (s) vs one kernel flock file", n),
		fmtNum(drain) + " s", fmtNum(kdrain) + " s", fmtNum(drain / kdrain), g, met})
	g, met = res.met("drain_10k_rss_mb", &rssGoal)
	res.addRow(Row{fmt.Sprintf("daemon peak RSS, %d waiters queued and drained (MiB)", n),
		fmtNum(rss) + " MiB", fmt.Sprintf("%.0f MiB when all were queued (in %.1f s); %d errors", queuedRSS, queued.Seconds(), errs), "", g, met})
	return nil
}

// drainOnce holds ctl with a loadgen lock, queues n waiters on it
// (loadgen waiters), waits until isQueued, lets the holder go and waits
// for the last grant. It returns how long the waiters took to queue, the
// drain in seconds from the release to the last grant, and how many lock
// calls failed.
func (r *runner) drainOnce(ctx context.Context, name, ctl string, n int, isQueued func() bool) (queued time.Duration, drain float64, errs int, err error) {
	holder, err := r.startLineProc(name+"-holder", "lock", "-file", ctl)
	if err != nil {
		return 0, 0, 0, err
	}
	defer holder.stop()
	if _, err := holder.line(ctx, time.Minute); err != nil {
		return 0, 0, 0, err
	}
	waiters := exec.CommandContext(ctx, r.bin(binLoadgen), "waiters", "-file", ctl, "-n", fmt.Sprint(n))
	waiters.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	waiters.Env = loadgenEnv()
	out, err := waiters.StdoutPipe()
	if err != nil {
		return 0, 0, 0, err
	}
	var stderr bytes.Buffer
	waiters.Stderr = &stderr
	start := time.Now()
	if err := waiters.Start(); err != nil {
		return 0, 0, 0, err
	}
	defer waiters.Wait()
	defer waiters.Process.Kill() // a no-op once it has exited
	for !isQueued() {
		if time.Since(start) > 5*time.Minute {
			return 0, 0, 0, fmt.Errorf("%s: the %d waiters did not all queue within 5 minutes", name, n)
		}
		select {
		case <-ctx.Done():
			return 0, 0, 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	queued = time.Since(start)
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, 0, 0, err
	}
	holder.stop() // the holder lets go: the queue drains
	var done struct{ First_ns, Last_ns, Errors float64 }
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if err := json.Unmarshal(lines.Bytes(), &done); err == nil && done.Last_ns > 0 {
			break
		}
	}
	if done.Last_ns == 0 {
		return 0, 0, 0, fmt.Errorf("%s: loadgen waiters: no result: %s", name, stderr.String())
	}
	return queued, (done.Last_ns - float64(ts.Nano())) / 1e9, int(done.Errors), nil
}

// kernelBlocked counts the requests blocked on path's inode in /proc/locks
// (the lines marked "->").
func kernelBlocked(path string) int {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0
	}
	data, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0
	}
	id := fmt.Sprintf(":%d ", st.Ino)
	blocked := 0
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, "->") && strings.Contains(line, id) {
			blocked++
		}
	}
	return blocked
}
