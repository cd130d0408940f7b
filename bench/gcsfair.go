package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// Fair turns between gcs hosts, lock-delay and the want path (issues 27
// and 28), each beside its reference from the same run:
//   - gcs_want_noticed_s (_max): two backends in this process; host A holds
//     a lock, host B claims it with wait; from B's claim to the moment A's
//     lease reports itself contended (A has read its bell and listed the
//     want). Mean over fairNoticeReps locks.
//   - fair_cross_host_wait_s (_min, _max): two `lockfs mount --backend gcs`
//     daemons with the default settings; host A runs three loops of `flock
//     -x f/.lock sleep 0.2` (continuous demand); host B runs `flock -x -w 60
//     f/.lock true` and the time it takes is recorded (median over
//     fairReps). Reference fair_cross_host_wait_kernel_s: the same pattern
//     on one file's kernel flock.
//   - fair_min_share_4_hosts: four daemons, each running two such loops
//     for fairShareWindow (the 60 s); each host's share of the
//     grants, and min ÷ max (fair_share_4_hosts_{a,b,c,d}).
//   - paused_daemon_overlap_s: host A's daemon is SIGSTOPped for 1.5 × TTL
//     while its holder stamps CLOCK_MONOTONIC into a file under `flock -x`;
//     host B's holder waits and stamps the same file when it enters: how
//     long A's holder ran on beside B's (0 if not at all). Reference
//     paused_daemon_overlap_s_lock_delay_0: A's daemon with --lock-delay 0.
const (
	fairNoticeReps  = 5
	fairReps        = 2
	fairShareWindow = 60 * time.Second
)

// fairKeys are the keys of the fairness measurements.
var fairKeys = []string{"gcs_want_noticed_s", "fair_cross_host_wait_s", "fair_cross_host_wait_kernel_s",
	"fair_min_share_4_hosts", "paused_daemon_overlap_s", "paused_daemon_overlap_s_lock_delay_0"}

// fairGCS runs the fairness measurements of gcs hosts; the daemons' ones
// only if lockfs mount has the gcs backend.
func (g *gcsRun) fairGCS(ctx context.Context) error {
	if err := g.wantNoticed(ctx); err != nil {
		return fmt.Errorf("want noticed: %w", err)
	}
	if !g.daemons {
		for _, k := range fairKeys[1:] {
			g.r.res.setNull(k)
		}
		return nil
	}
	steps := []func(context.Context) error{g.crossHostWait, g.minShare, g.pausedOverlap}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// wantNoticed measures gcs_want_noticed_s.
func (g *gcsRun) wantNoticed(ctx context.Context) error {
	g.seq++
	prefix := fmt.Sprintf("notice%d/", g.seq)
	cfg := func(name string) gcsbackend.Config {
		c := g.gcsConfig(prefix, name)
		c.TTL = gcsbackend.DefaultTTL // the default WantPoll and TTL
		return c
	}
	a, err := gcsbackend.New(ctx, cfg(fmt.Sprintf("notice-a%d", g.seq)))
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := gcsbackend.New(ctx, cfg(fmt.Sprintf("notice-b%d", g.seq)))
	if err != nil {
		return err
	}
	defer b.Close()
	var noticed []float64
	for i := 0; i < min(fairNoticeReps, g.r.cfg.GCSReps+1); i++ {
		id := lockmgr.LockID{Path: fmt.Sprintf("n%d", i), Kind: lockmgr.KindDir}
		l, err := a.Claim(ctx, id, lockmgr.Exclusive, false)
		if err != nil {
			return err
		}
		// A's bell reads come every WantPoll: ask at a random phase of
		// them, not in step with the last rep's notice.
		time.Sleep(rand.N(gcsbackend.DefaultWantPoll))
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		got := make(chan error, 1)
		asked := time.Now()
		go func() {
			lb, err := b.Claim(wctx, id, lockmgr.Exclusive, true)
			if err == nil {
				err = lb.Release(ctx)
			}
			got <- err
		}()
		select {
		case <-l.(lockmgr.ContendedLease).Contended():
			noticed = append(noticed, time.Since(asked).Seconds())
		case err := <-got:
			cancel()
			return fmt.Errorf("B's claim ended while A held the lock: %v", err)
		case <-time.After(30 * time.Second):
			cancel()
			return errors.New("A's lease was not contended 30 s after B asked")
		}
		if err := l.Release(ctx); err != nil {
			cancel()
			return err
		}
		err = <-got
		cancel()
		if err != nil {
			return fmt.Errorf("B after A's release: %w", err)
		}
	}
	s := summarize(noticed)
	g.r.res.set("gcs_want_noticed_s", mean(noticed))
	g.r.res.set("gcs_want_noticed_s_max", s.Max)
	g.r.logf("gcs want noticed: %v s", noticed)
	gl := atMost(2)
	gt, met := g.r.res.met("gcs_want_noticed_s", &gl)
	g.r.res.addRow(Row{fmt.Sprintf("GCS: another host's want noticed by the holder, s (mean of %d; WantPoll %v)", len(noticed), gcsbackend.DefaultWantPoll),
		fmt.Sprintf("%.3g", mean(noticed)), fmt.Sprintf("max %.3g", s.Max), "", gt, met})
	return nil
}

func mean(xs []float64) float64 {
	var t float64
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

// fairDaemon starts a gcs daemon named name on prefix, over a SOURCE with
// directories gcsLock and f, with extra flags.
func (g *gcsRun) fairDaemon(ctx context.Context, prefix, name string, extra ...string) (*mount, error) {
	r := g.r
	src, err := r.dir("src-" + name)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{gcsLock, "f"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			return nil, err
		}
	}
	mnt, err := r.dir("mnt", name)
	if err != nil {
		return nil, err
	}
	args := append([]string{"mount", "--log-level", "warn", "--backend", "gcs", "--gcs-bucket", gcsBucket, "--gcs-prefix", prefix,
		"--gcs-endpoint", g.proxy.endpoint(), "--lease-ttl", g.ttl.String(), "--host-id", name}, extra...)
	m, err := startMount(ctx, name, r.logDir, mnt, r.bin(binLockfs), append(args, src, mnt)...)
	if err != nil {
		return nil, err
	}
	r.atClose(m.unmount)
	return m, nil
}

// demand starts n loops of `flock -x LOCK sh -c 'echo x >> COUNT; sleep
// 0.2'` in one process group, and returns a function that kills the group.
func (g *gcsRun) demand(name, lock, count string, n int) (func(), error) {
	script := fmt.Sprintf(`for i in $(seq %d); do (while :; do flock -x %q sh -c 'echo x >> %q; sleep 0.2'; done) & done; wait`, n, lock, count)
	b, err := startBackground(name, g.r.logDir, "sh", "-c", script)
	if err != nil {
		return nil, err
	}
	return func() {
		_ = syscall.Kill(-b.pid(), syscall.SIGKILL)
		<-b.done
	}, nil
}

// waitFor runs `flock -x -w 60 LOCK true` and returns how long it took: 60
// s or more if it timed out (flock's exit status 1), which the key then
// shows.
func waitFor(ctx context.Context, lock string) (time.Duration, error) {
	start := time.Now()
	out, err := exec.CommandContext(ctx, "flock", "-x", "-w", "60", lock, "true").CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		return 0, fmt.Errorf("flock -x -w 60 %s: %v %s", lock, err, out)
	}
	return time.Since(start), nil
}

// crossHostWait measures fair_cross_host_wait_s and its kernel reference.
func (g *gcsRun) crossHostWait(ctx context.Context) error {
	r := g.r
	var waits, kernel []float64
	for rep := 0; rep < min(fairReps, g.r.cfg.GCSReps); rep++ {
		g.seq++
		prefix := fmt.Sprintf("fair%d/", g.seq)
		a, err := g.fairDaemon(ctx, prefix, fmt.Sprintf("fair-a%d", g.seq))
		if err != nil {
			return err
		}
		b, err := g.fairDaemon(ctx, prefix, fmt.Sprintf("fair-b%d", g.seq))
		if err != nil {
			a.unmount()
			return err
		}
		d, err := func() (time.Duration, error) {
			defer b.unmount()
			defer a.unmount()
			stop, err := g.demand(fmt.Sprintf("fair-demand%d", g.seq), filepath.Join(a.dir, "f", ".lock"), os.DevNull, 3)
			if err != nil {
				return 0, err
			}
			defer stop()
			time.Sleep(2 * time.Second) // A's lease is busy
			return waitFor(ctx, filepath.Join(b.dir, "f", ".lock"))
		}()
		if err != nil {
			return fmt.Errorf("cross-host wait: %w", err)
		}
		waits = append(waits, d.Seconds())

		// The reference: one file's kernel flock.
		dir, err := r.dir(fmt.Sprintf("fair-kernel%d", g.seq))
		if err != nil {
			return err
		}
		file := filepath.Join(dir, "lock")
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			return err
		}
		stop, err := g.demand(fmt.Sprintf("fair-kdemand%d", g.seq), file, os.DevNull, 3)
		if err != nil {
			return err
		}
		time.Sleep(2 * time.Second)
		kd, err := waitFor(ctx, file)
		stop()
		if err != nil {
			return err
		}
		kernel = append(kernel, kd.Seconds())
		r.logf("fair cross-host wait rep %d: gcs %.3fs, kernel flock %.3fs", rep, d.Seconds(), kd.Seconds())
	}
	s, k := summarize(waits), summarize(kernel)
	r.res.setSummary("fair_cross_host_wait_s", s)
	r.res.setSummary("fair_cross_host_wait_kernel_s", k)
	gl := atMost(4)
	gt, met := r.res.met("fair_cross_host_wait_s", &gl)
	r.res.addRow(Row{"GCS: a host's wait for a lock another host uses continuously (3 loops of flock -x sleep 0.2), s",
		fmtSummary(s, ""), "kernel flock, one file: " + fmtSummary(k, ""), "", gt, met})
	return nil
}

// minShare measures fair_min_share_4_hosts.
func (g *gcsRun) minShare(ctx context.Context) error {
	r := g.r
	g.seq++
	prefix := fmt.Sprintf("share%d/", g.seq)
	hosts := []string{"a", "b", "c", "d"}
	var ms []*mount
	defer func() {
		for _, m := range ms {
			m.unmount()
		}
	}()
	for _, h := range hosts {
		m, err := g.fairDaemon(ctx, prefix, fmt.Sprintf("share-%s%d", h, g.seq))
		if err != nil {
			return err
		}
		ms = append(ms, m)
	}
	dir, err := r.dir(fmt.Sprintf("share-counts%d", g.seq))
	if err != nil {
		return err
	}
	var stops []func()
	for i, h := range hosts {
		stop, err := g.demand(fmt.Sprintf("share-demand-%s%d", h, g.seq), filepath.Join(ms[i].dir, "f", ".lock"), filepath.Join(dir, h), 2)
		if err != nil {
			for _, s := range stops {
				s()
			}
			return err
		}
		stops = append(stops, stop)
	}
	window := fairShareWindow
	if r.cfg.Smoke {
		window = 2 * time.Second
	}
	time.Sleep(window)
	for _, s := range stops {
		s()
	}
	var counts []float64
	total := 0.0
	for _, h := range hosts {
		n, err := countLines(filepath.Join(dir, h))
		if err != nil {
			return err
		}
		counts = append(counts, float64(n))
		total += float64(n)
	}
	lo, hi := counts[0], counts[0]
	for _, c := range counts {
		lo, hi = min(lo, c), max(hi, c)
	}
	ratio := 0.0
	if hi > 0 {
		ratio = lo / hi
	}
	r.res.set("fair_min_share_4_hosts", ratio)
	var shares []string
	for i, h := range hosts {
		share := 0.0
		if total > 0 {
			share = counts[i] / total
		}
		r.res.set("fair_share_4_hosts_"+h, share)
		shares = append(shares, fmt.Sprintf("%s %.0f", h, counts[i]))
	}
	r.logf("fair shares over %v: %s", window, strings.Join(shares, ", "))
	gl := atLeast(0.5)
	gt, met := r.res.met("fair_min_share_4_hosts", &gl)
	r.res.addRow(Row{fmt.Sprintf("GCS: 4 hosts under continuous demand for one lock, %v: min ÷ max of their grants", window),
		fmt.Sprintf("%.2f", ratio), "grants " + strings.Join(shares, ", "), "", gt, met})
	return nil
}

// countLines counts the lines of a file (0 if it does not exist).
func countLines(path string) (int, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
	}
	return n, sc.Err()
}
