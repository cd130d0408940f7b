package bench

// A paused host's overlap: how long a holder that was paused (SIGSTOP)
// overlaps with the host that took its locks over, with and without
// lock-delay.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/lockfs/lockfs/internal/stamp"
)

// pausedOverlap measures paused_daemon_overlap_s and its reference.
func (g *gcsRun) pausedOverlap(ctx context.Context) error {
	r := g.r
	if _, err := exec.LookPath("python3"); err != nil {
		r.res.setNull("paused_daemon_overlap_s")
		r.res.setNull("paused_daemon_overlap_s_lock_delay_0")
		r.res.notes["paused_daemon_overlap_unavailable_reason"] = "python3 is not installed"
		return nil
	}
	var got [2]float64
	delays := []string{"", "0"}
	if r.cfg.Smoke {
		delays = delays[:1] // the harness works; the reference costs 2 × TTL more
		got[1] = math.NaN()
	}
	for i, delay := range delays {
		d, err := g.pausedOnce(ctx, delay)
		if err != nil {
			return fmt.Errorf("paused daemon (lock-delay %q): %w", delay, err)
		}
		got[i] = d.Seconds()
	}
	r.res.set("paused_daemon_overlap_s", got[0])
	if r.cfg.Smoke {
		r.res.setNull("paused_daemon_overlap_s_lock_delay_0")
	} else {
		r.res.set("paused_daemon_overlap_s_lock_delay_0", got[1])
	}
	gl := equal(0)
	gt, met := r.res.met("paused_daemon_overlap_s", &gl)
	r.res.addRow(Row{fmt.Sprintf("GCS: a daemon paused 1.5 × TTL while its holder works: s its holder ran beside the next host's (TTL %v)", g.ttl),
		fmt.Sprintf("%.3g", got[0]), fmt.Sprintf("--lock-delay 0: %.3g", got[1]), "", gt, met})
	return nil
}

// pausedOnce runs the paused-daemon scenario once with A's --lock-delay
// (empty: the default) and returns the overlap.
func (g *gcsRun) pausedOnce(ctx context.Context, delay string) (time.Duration, error) {
	r := g.r
	g.seq++
	prefix := fmt.Sprintf("paused%d/", g.seq)
	var extra []string
	if delay != "" {
		extra = []string{"--lock-delay", delay}
	}
	a, err := g.fairDaemon(ctx, prefix, fmt.Sprintf("paused-a%d", g.seq), extra...)
	if err != nil {
		return 0, err
	}
	defer a.unmount()
	b, err := g.fairDaemon(ctx, prefix, fmt.Sprintf("paused-b%d", g.seq))
	if err != nil {
		return 0, err
	}
	defer b.unmount()
	dir, err := r.dir(fmt.Sprintf("paused-stamps%d", g.seq))
	if err != nil {
		return 0, err
	}
	stamps := filepath.Join(dir, "stamps")
	ha, err := startBackground(fmt.Sprintf("paused-holder-a%d", g.seq), r.logDir, "flock", "-x", filepath.Join(a.dir, "f", ".lock"),
		"python3", "-c", stamp.Program, "A", stamps, "1000")
	if err != nil {
		return 0, err
	}
	defer func() { _ = syscall.Kill(-ha.pid(), syscall.SIGKILL); <-ha.done }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if n, _ := countLines(stamps); n > 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("A's holder did not start: %s", ha.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(g.refreshInterval * 3 / 2) // across a heartbeat
	hb, err := startBackground(fmt.Sprintf("paused-holder-b%d", g.seq), r.logDir, "flock", "-x", filepath.Join(b.dir, "f", ".lock"),
		"python3", "-c", stamp.Program, "B", stamps, "0.5")
	if err != nil {
		return 0, err
	}
	defer func() { _ = syscall.Kill(-hb.pid(), syscall.SIGKILL); <-hb.done }()
	time.Sleep(300 * time.Millisecond)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return 0, err
	}
	time.Sleep(g.ttl * 3 / 2)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return 0, err
	}
	select {
	case <-hb.done:
	case <-time.After(4*g.ttl + 30*time.Second):
		return 0, errors.New("B's holder did not get the lock")
	}
	select {
	case <-ha.done:
	case <-time.After(10 * time.Second):
		return 0, errors.New("A's holder was not stopped within 10 s of its daemon's resumption")
	}
	spans, err := stamp.Spans(stamps)
	if err != nil {
		return 0, err
	}
	overlap := spans["A"][1] - spans["B"][0]
	if _, ok := spans["B"]; !ok {
		return 0, errors.New("no stamp of B's holder")
	}
	r.logf("paused daemon (lock-delay %q): A's holder's last stamp %.3fs after B's first", delay, overlap)
	return time.Duration(max(overlap, 0) * float64(time.Second)), nil
}
