package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
//     for fairShareWindow (shortened from the 60 s to keep make
//     bench within its 12 minutes); each host's share of the grants, and
//     min ÷ max (fair_share_4_hosts_{a,b,c,d}).
//   - paused_daemon_overlap_s: host A's daemon is SIGSTOPped for 1.5 × TTL
//     while its holder stamps CLOCK_MONOTONIC into a file under `flock -x`;
//     host B's holder waits and stamps the same file when it enters: how
//     long A's holder ran on beside B's (0 if not at all). Reference
//     paused_daemon_overlap_s_lock_delay_0: A's daemon with --lock-delay 0.
const (
	fairNoticeReps  = 5
	fairReps        = 2
	fairShareWindow = 20 * time.Second
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

// stamper appends "TAG <CLOCK_MONOTONIC seconds>" to FILE every 10 ms
// for SECONDS (argv: TAG FILE SECONDS).
const stamper = `
import os, sys, time
tag, out, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
def stamp():
    os.write(fd, ("%s %.6f\n" % (tag, time.monotonic())).encode())
stamp()
end = time.monotonic() + secs
while time.monotonic() < end:
    time.sleep(0.01)
    stamp()
stamp()
`

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
		"python3", "-c", stamper, "A", stamps, "1000")
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
		"python3", "-c", stamper, "B", stamps, "0.5")
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
	first, last, err := stampSpan(stamps)
	if err != nil {
		return 0, err
	}
	overlap := last["A"] - first["B"]
	if _, ok := first["B"]; !ok {
		return 0, errors.New("no stamp of B's holder")
	}
	r.logf("paused daemon (lock-delay %q): A's holder's last stamp %.3fs after B's first", delay, overlap)
	return time.Duration(max(overlap, 0) * float64(time.Second)), nil
}

// stampSpan reads a stamper file: each tag's first and last stamp.
func stampSpan(file string) (first, last map[string]float64, err error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	first, last = map[string]float64{}, map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		tag, v, _ := strings.Cut(sc.Text(), " ")
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, nil, fmt.Errorf("stamp line %q", sc.Text())
		}
		if _, ok := first[tag]; !ok {
			first[tag] = x
		}
		last[tag] = x
	}
	return first, last, sc.Err()
}
