package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/daemon"
	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// gcsBucket is the emulator bucket the GCS measurements use.
const gcsBucket = "lockfs-bench"

// gcsLock is the lock the GCS measurements take: depth 4, as elsewhere.
// A claim writes its own lock's record only; the 4 ancestors' (".", "a",
// "a/b", "a/b/c") are read (docs/GCS-PROTOCOL.md §5).
const gcsLock = "a/b/c/d"

// gcsSibling is a second lock at gcsLock's depth, under the same
// ancestors, with a record of its own.
const gcsSibling = "a/b/c/e"

// gcs: GCS requests counted at a proxy in front of the emulator, for an
// engine (lockmgr.Engine) over gcsbackend in this process, and the takeover
// time after a holder host is killed with SIGKILL.
//
// Keys (each a median over Config.GCSReps with _min and _max):
//   - gcs_writes_first_acquire, gcs_reads_first_acquire: a fresh host's
//     first acquire, of gcsLock, which also starts the host's session.
//   - gcs_writes_per_acquire, gcs_reads_per_acquire: then, on the same
//     host, an uncontended exclusive acquire of gcsSibling (a record of its
//     own, the session running: the acquire docs/GCS-PROTOCOL.md §10 and
//     the spec's "at most one write at any depth" are about);
//     gcs_writes_per_release, gcs_reads_per_release: its release.
//     gcs_writes_per_acquire_root and gcs_writes_per_release_root: the
//     same for the root lock ".".
//   - gcs_requests_local_handoff: requests between one process's release
//     and the grant to another process of the same host waiting for it
//     (on a host of TTL handoffTTL, whose refreshes stay out of the way).
//   - gcs_refreshes_per_ttl: requests per TTL while gcsLock is held (the
//     session's heartbeats, and the listings of wants).
//   - gcs_takeover_s_minus_ttl: from the moment the holder host's last
//     session write (its last heartbeat, as the proxy saw it answered)
//     landed until a waiting host holds the lock, minus the TTL and the
//     lock-delay (gcs_ttl_s, gcs_lock_delay_s: the default, the TTL; the
//     refresh interval is gcs_refresh_interval_s): the "last sign" of
//     the dead host. gcs_takeover_s_after_kill_minus_ttl: the same from the
//     SIGKILL of the holder host, which comes up to a refresh interval
//     after that heartbeat. When `lockfs mount` has
//     --backend gcs, the hosts are two lockfs daemons and the lock is
//     taken with flock through their mounts (gcs_takeover_daemons = 1);
//     otherwise the holder is a helper process with its own engine and
//     backend, and the waiter an engine in this process (0).
func (r *runner) gcs(ctx context.Context) error {
	bin, err := emulatorBinary(ctx, r.modDir)
	if err != nil {
		r.gcsUnavailable(fmt.Sprintf("cannot build the GCS emulator %s: %v", benchEmulator, err))
		return nil
	}
	emu, err := startEmulator(ctx, bin, r.logDir, gcsBucket)
	if err != nil {
		return err
	}
	defer emu.stop(time.Second)
	proxy, err := startCountingProxy(emu.url)
	if err != nil {
		return err
	}
	defer proxy.close()
	g := &gcsRun{r: r, proxy: proxy, ttl: r.cfg.GCSTTL}
	takeover := g.takeover
	if r.lockfsHasGCS(ctx) {
		takeover, g.daemons = g.takeoverDaemons, true
	}
	for _, step := range []func(context.Context) error{g.counts, g.costs, g.handoff, g.refreshes, takeover, g.fairGCS} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	g.report()
	return nil
}

// gcsKeys are the keys the GCS measurements produce.
var gcsKeys = []string{
	"gcs_writes_first_acquire", "gcs_reads_first_acquire",
	"gcs_writes_per_acquire", "gcs_reads_per_acquire", "gcs_writes_per_release", "gcs_reads_per_release",
	"gcs_writes_per_acquire_root", "gcs_writes_per_release_root", "gcs_requests_local_handoff",
	"gcs_refreshes_per_ttl", "gcs_takeover_s_minus_ttl", "gcs_takeover_s_after_kill_minus_ttl",
	"gcs_writes_cold_acquire_release_depth4", "gcs_writes_per_warm_iteration_depth4", "gcs_acquire_ms_depth4_rtt30",
	"gcs_writes_per_refresh_interval_1000_held", "gcs_refresh_1000_held_losses",
}

// gcsUnavailable records every GCS key as null, with the reason.
func (r *runner) gcsUnavailable(reason string) {
	r.logf("gcs: unavailable: %s", reason)
	for _, k := range append(gcsKeys, fairKeys...) {
		r.res.setNull(k)
	}
	r.res.notes["gcs_unavailable_reason"] = reason
	r.res.addRow(Row{"GCS request counts and takeover", "unavailable: " + reason, "", "", "", "n/a"})
}

// gcsRun is the state of the GCS measurements.
type gcsRun struct {
	r     *runner
	proxy *countingProxy
	ttl   time.Duration
	seq   int // names fresh prefixes and hosts

	firstW, firstR                                                                                 []float64
	acqW, acqR, relW, relR, rootAcqW, rootRelW, handoffReqs, refreshRate, takeoverS, takeoverKillS []float64
	coldW, warmW, rttMs                                                                            []float64
	heldWrites, heldReads, heldLosses                                                              float64
	heldErr                                                                                        string // why the GCSHeld locks could not be held
	refreshInterval                                                                                time.Duration
	// daemons: the takeover ran between two `lockfs mount --backend gcs`
	// daemons (else between engines: a helper process and this one).
	daemons bool
}

// host is one daemon's backend and engine.
type gcsHost struct {
	b *gcsbackend.Backend
	e *lockmgr.Engine
}

// engineOver starts an in-process daemon without a mount over b (a gcs
// backend whose requests the bench counts) and returns its engine, whose
// Close stops it. The daemon owns b from here on, even on error.
func engineOver(b lockmgr.Backend, onLoss func(lockmgr.LostHold)) (*lockmgr.Engine, error) {
	d, err := daemon.Start(daemon.Config{Use: b, Processes: soloProcs{}, OnLoss: onLoss})
	if err != nil {
		return nil, err
	}
	return d.Engine(), nil
}

func (h *gcsHost) close() {
	if err := h.e.Close(); err != nil {
		_ = err // a release that failed at close expires after its TTL
	}
}

// gcsConfig is the backend configuration of host name under prefix.
func (g *gcsRun) gcsConfig(prefix, name string) gcsbackend.Config {
	return gcsbackend.Config{
		Bucket:   gcsBucket,
		Prefix:   prefix,
		Endpoint: g.proxy.endpoint(),
		TTL:      g.ttl,
		HostID:   name,
	}
}

// handoffTTL is the TTL of the local hand-off's host: its refreshes (one
// every TTL/3) must leave room for the hand-off's window (about 300 ms of
// settling), or every window meets one. With the smoke run's 1 s TTL they
// came every 333 ms, and the run failed now and then.
const handoffTTL = 30 * time.Second

// newHost starts a backend and an engine on a fresh prefix (or the given one).
func (g *gcsRun) newHost(ctx context.Context, prefix string) (*gcsHost, string, error) {
	return g.newHostLoss(ctx, prefix, nil)
}

// newHostLoss is newHost with an engine that reports every lost hold to
// onLoss.
func (g *gcsRun) newHostLoss(ctx context.Context, prefix string, onLoss func(lockmgr.LostHold)) (*gcsHost, string, error) {
	return g.newHostTTL(ctx, prefix, g.ttl, onLoss)
}

// newHostTTL is newHostLoss with a TTL of its own; the run's refresh
// interval is recorded from hosts with the run's TTL only.
func (g *gcsRun) newHostTTL(ctx context.Context, prefix string, ttl time.Duration, onLoss func(lockmgr.LostHold)) (*gcsHost, string, error) {
	g.seq++
	if prefix == "" {
		prefix = fmt.Sprintf("run%d/", g.seq)
	}
	cfg := g.gcsConfig(prefix, fmt.Sprintf("bench-host-%d", g.seq))
	cfg.TTL = ttl
	b, err := gcsbackend.New(ctx, cfg)
	if err != nil {
		return nil, "", err
	}
	if ttl == g.ttl {
		g.refreshInterval = b.Config().RefreshInterval
	}
	e, err := engineOver(b, onLoss)
	if err != nil {
		return nil, "", err
	}
	return &gcsHost{b: b, e: e}, prefix, nil
}

// request is an exclusive flock-style request by client c, a process of
// its own.
func gcsRequest(path string, c int, wait bool) lockmgr.Request {
	return lockmgr.Request{Lock: lockmgr.LockID{Path: path, Kind: lockmgr.KindDir}, Mode: lockmgr.Exclusive,
		Owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: uint64(c)}, TID: c, Wait: wait}
}

// settle waits until the proxy has seen no request for quiet (at most max),
// so that asynchronous work (a release in the background) is counted.
func (g *gcsRun) settle(quiet, limit time.Duration) requestCounts {
	last, since, end := g.proxy.counts(), time.Now(), time.Now().Add(limit)
	for time.Now().Before(end) {
		time.Sleep(10 * time.Millisecond)
		c := g.proxy.counts()
		if c != last {
			last, since = c, time.Now()
		} else if time.Since(since) >= quiet {
			break
		}
	}
	return last
}

// counts: on a fresh host, the first acquire and release (of gcsLock,
// starting the session), then an uncontended acquire and release of
// gcsSibling, and of ".". The host's TTL is handoffTTL, so that its
// heartbeats stay out of the counted windows; a repetition in which one
// fell into them all the same is run again.
func (g *gcsRun) counts(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for rep, tries := 0, 0; rep < g.r.cfg.GCSReps; tries++ {
		if tries > 5*g.r.cfg.GCSReps {
			return errors.New("every repetition of the request counts met a heartbeat")
		}
		h, _, err := g.newHostTTL(ctx, "", handoffTTL, nil)
		if err != nil {
			return err
		}
		var acq, rel [3]requestCounts
		paths := [3]string{gcsLock, gcsSibling, "."}
		refreshed, err := func() (bool, error) {
			defer h.close()
			s0 := h.b.Stats()
			for i, path := range paths {
				req := gcsRequest(path, 1, false)
				c0 := g.settle(100*time.Millisecond, time.Second)
				if _, err := h.e.Acquire(ctx, req); err != nil {
					return false, err
				}
				c1 := g.proxy.counts()
				if err := h.e.Release(ctx, req.Lock, req.Owner); err != nil {
					return false, err
				}
				c2 := g.settle(300*time.Millisecond, 5*time.Second)
				acq[i], rel[i] = c1.sub(c0), c2.sub(c1)
			}
			return h.b.Stats().Refreshes != s0.Refreshes, nil
		}()
		if err != nil {
			return err
		}
		for i, path := range paths {
			g.r.logf("gcs counts rep %d %q: acquire %d writes %d reads; release %d writes %d reads (heartbeat in the windows: %v)",
				rep, path, acq[i].Writes, acq[i].Reads, rel[i].Writes, rel[i].Reads, refreshed)
		}
		if refreshed {
			continue
		}
		g.firstW, g.firstR = append(g.firstW, float64(acq[0].Writes)), append(g.firstR, float64(acq[0].Reads))
		g.acqW, g.acqR = append(g.acqW, float64(acq[1].Writes)), append(g.acqR, float64(acq[1].Reads))
		g.relW, g.relR = append(g.relW, float64(rel[1].Writes)), append(g.relR, float64(rel[1].Reads))
		g.rootAcqW, g.rootRelW = append(g.rootAcqW, float64(acq[2].Writes)), append(g.rootRelW, float64(rel[2].Writes))
		rep++
	}
	return nil
}

// handoff: process 1 holds gcsLock, process 2 of the same host waits for
// it; the requests from 1's release to 2's grant (and the settling after)
// are counted. The host's TTL is handoffTTL; a repetition in which a
// refresh fell into the window all the same is run again.
func (g *gcsRun) handoff(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	h, _, err := g.newHostTTL(ctx, "", handoffTTL, nil)
	if err != nil {
		return err
	}
	defer h.close()
	for rep, tries := 0, 0; rep < g.r.cfg.GCSReps; tries++ {
		if tries > 5*g.r.cfg.GCSReps {
			return errors.New("every local hand-off window met a refresh")
		}
		first, second := gcsRequest(gcsLock, 1, false), gcsRequest(gcsLock, 2, true)
		if _, err := h.e.Acquire(ctx, first); err != nil {
			return err
		}
		granted := make(chan error, 1)
		go func() {
			_, err := h.e.Acquire(ctx, second)
			granted <- err
		}()
		time.Sleep(50 * time.Millisecond) // let 2 queue
		c0 := g.settle(50*time.Millisecond, time.Second)
		s0 := h.b.Stats()
		if err := h.e.Release(ctx, first.Lock, first.Owner); err != nil {
			return err
		}
		if err := <-granted; err != nil {
			return err
		}
		c1 := g.settle(200*time.Millisecond, 3*time.Second)
		refreshed := h.b.Stats().Refreshes != s0.Refreshes
		if err := h.e.Release(ctx, second.Lock, second.Owner); err != nil {
			return err
		}
		g.settle(200*time.Millisecond, 3*time.Second)
		if refreshed {
			continue
		}
		d := c1.sub(c0)
		g.handoffReqs = append(g.handoffReqs, float64(d.total()))
		g.r.logf("gcs local hand-off rep %d: %d requests", rep, d.total())
		rep++
	}
	return nil
}

// refreshes: requests while gcsLock is held, in windows of GCSHoldTTLs
// TTLs.
func (g *gcsRun) refreshes(ctx context.Context) error {
	h, _, err := g.newHost(ctx, "")
	if err != nil {
		return err
	}
	defer h.close()
	req := gcsRequest(gcsLock, 1, false)
	if _, err := h.e.Acquire(ctx, req); err != nil {
		return err
	}
	c := g.settle(100*time.Millisecond, time.Second)
	window := time.Duration(g.r.cfg.GCSHoldTTLs) * g.ttl
	for rep := 0; rep < g.r.cfg.GCSReps; rep++ {
		start := time.Now()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(window):
		}
		c1 := g.proxy.counts()
		per := float64(c1.sub(c).total()) / (time.Since(start).Seconds() / g.ttl.Seconds())
		g.refreshRate = append(g.refreshRate, per)
		g.r.logf("gcs refreshes window %d: %.1f requests per TTL", rep, per)
		c = c1
	}
	return h.e.Release(ctx, req.Lock, req.Owner)
}

// takeover: a holder host (a child process) holds gcsLock; this process's
// host waits for it; the holder is killed with SIGKILL; the time until the
// waiter holds the lock, minus the TTL, is recorded.
func (g *gcsRun) takeover(ctx context.Context) error {
	for rep := 0; rep < g.r.cfg.GCSReps; rep++ {
		g.seq++
		prefix := fmt.Sprintf("takeover%d/", g.seq)
		holderID := fmt.Sprintf("bench-holder-%d", g.seq)
		holder, err := g.r.startGCSHolder(ctx, g.gcsConfig(prefix, holderID), gcsLock)
		if err != nil {
			return err
		}
		var sinceBeat time.Duration // from the holder's last heartbeat to the kill
		d, err := func() (time.Duration, error) {
			defer holder.stop(time.Second)
			h, _, err := g.newHost(ctx, prefix)
			if err != nil {
				return 0, err
			}
			defer h.close()
			wctx, cancel := context.WithTimeout(ctx, 10*g.ttl+30*time.Second)
			defer cancel()
			req := gcsRequest(gcsLock, 1, true)
			granted := make(chan time.Time, 1)
			failed := make(chan error, 1)
			go func() {
				if _, err := h.e.Acquire(wctx, req); err != nil {
					failed <- err
					return
				}
				granted <- time.Now()
			}()
			// Let the waiter block, and the holder refresh at least once.
			time.Sleep(g.refreshInterval * 3 / 2)
			select {
			case <-granted:
				return 0, errors.New("the waiter was granted while the holder lived")
			case err := <-failed:
				return 0, err
			default:
			}
			killed := time.Now()
			if err := holder.cmd.Process.Kill(); err != nil {
				return 0, err
			}
			beat, err := g.lastHeartbeat(prefix, holderID)
			if err != nil {
				return 0, err
			}
			sinceBeat = killed.Sub(beat)
			select {
			case t := <-granted:
				return t.Sub(killed), h.e.Release(ctx, req.Lock, req.Owner)
			case err := <-failed:
				return 0, err
			}
		}()
		if err != nil {
			return err
		}
		g.addTakeover(rep, d, sinceBeat)
	}
	return nil
}

func (g *gcsRun) report() {
	g.reportCosts()
	r := g.r
	put := func(key string, xs []float64) summary {
		s := summarize(xs)
		r.res.setSummary(key, s)
		return s
	}
	firstW, firstR := put("gcs_writes_first_acquire", g.firstW), put("gcs_reads_first_acquire", g.firstR)
	acqW, relW := put("gcs_writes_per_acquire", g.acqW), put("gcs_writes_per_release", g.relW)
	acqR, relR := put("gcs_reads_per_acquire", g.acqR), put("gcs_reads_per_release", g.relR)
	rootA, rootR := put("gcs_writes_per_acquire_root", g.rootAcqW), put("gcs_writes_per_release_root", g.rootRelW)
	ho := put("gcs_requests_local_handoff", g.handoffReqs)
	rf := put("gcs_refreshes_per_ttl", g.refreshRate)
	to := put("gcs_takeover_s_minus_ttl", g.takeoverS)
	tk := put("gcs_takeover_s_after_kill_minus_ttl", g.takeoverKillS)
	if g.daemons {
		r.res.set("gcs_takeover_daemons", 1)
	} else {
		r.res.set("gcs_takeover_daemons", 0)
	}
	r.res.set("gcs_ttl_s", g.ttl.Seconds())
	r.res.set("gcs_lock_delay_s", g.lockDelay().Seconds())
	r.res.set("gcs_refresh_interval_s", g.refreshInterval.Seconds())

	row := func(name, key string, s summary, ref string, gl *goal) {
		gt, met := r.res.met(key, gl)
		r.res.addRow(Row{name, fmtSummary(s, ""), ref, "", gt, met})
	}
	one, two, zero := atMost(1), atMost(2), equal(0)
	row("GCS writes, a fresh host's first acquire, depth 4 (starts its session)", "gcs_writes_first_acquire", firstW,
		fmt.Sprintf("reads %s", fmtSummary(firstR, "")), &two)
	row("GCS writes per uncontended acquire, depth 4 (session running)", "gcs_writes_per_acquire", acqW,
		fmt.Sprintf("reads %s; root lock: %s", fmtSummary(acqR, ""), fmtSummary(rootA, "")), &one)
	row("GCS writes per release, depth 4", "gcs_writes_per_release", relW,
		fmt.Sprintf("reads %s; root lock: %s", fmtSummary(relR, ""), fmtSummary(rootR, "")), &one)
	row("GCS requests per hand-off between 2 processes of one host", "gcs_requests_local_handoff", ho, "", &zero)
	row(fmt.Sprintf("GCS requests per TTL holding one depth-4 lock (TTL %v)", g.ttl), "gcs_refreshes_per_ttl", rf,
		fmt.Sprintf("the session's heartbeat every %v", g.refreshInterval.Round(time.Millisecond)), nil)
	tg := between(0, 1)
	who := "the holder host's engine"
	if g.daemons {
		who = "the holder's lockfs daemon"
	}
	row(fmt.Sprintf("GCS takeover from the last heartbeat of %s (then kill -9), s minus TTL + lock-delay (TTL %v, lock-delay %v)", who, g.ttl, g.lockDelay()), "gcs_takeover_s_minus_ttl", to,
		fmt.Sprintf("from the kill: %s s", fmtSummary(tk, "")), &tg)
}

// lockfsHasGCS reports whether the lockfs binary takes --backend gcs.
func (r *runner) lockfsHasGCS(ctx context.Context) bool {
	out, _ := exec.CommandContext(ctx, r.bin(binLockfs), "mount", "-h").CombinedOutput()
	return strings.Contains(string(out), "gcs-endpoint")
}

// takeoverDaemons: two lockfs daemons with the gcs backend, A and B, over
// SOURCE trees of their own. A process on A takes gcsLock with flock; a
// process on B waits for it in flock; A's daemon is killed with SIGKILL;
// the time from the kill until B's process returns from flock, minus the
// TTL, is recorded.
func (g *gcsRun) takeoverDaemons(ctx context.Context) error {
	r := g.r
	for rep := 0; rep < r.cfg.GCSReps; rep++ {
		g.seq++
		prefix := fmt.Sprintf("daemons%d/", g.seq)
		var m [2]*mount
		for i, host := range []string{"a", "b"} {
			name := fmt.Sprintf("gcs-%s%d", host, g.seq)
			src, err := r.dir("src-" + name)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Join(src, gcsLock), 0o755); err != nil {
				return err
			}
			mnt, err := r.dir("mnt", name)
			if err != nil {
				return err
			}
			m[i], err = startMount(ctx, name, r.logDir, mnt, r.bin(binLockfs), "mount", "--log-level", "warn",
				"--backend", "gcs", "--gcs-bucket", gcsBucket, "--gcs-prefix", prefix,
				"--gcs-endpoint", g.proxy.endpoint(), "--lease-ttl", g.ttl.String(), "--host-id", name, src, mnt)
			if err != nil {
				return err
			}
			r.atClose(m[i].unmount)
		}
		var sinceBeat time.Duration // from A's last heartbeat to the kill
		d, err := func() (time.Duration, error) {
			defer m[1].unmount()
			defer m[0].unmount()
			holder, err := r.startLineProc(fmt.Sprintf("gcs-holder%d", g.seq), "lock", "-file", filepath.Join(m[0].dir, gcsLock, ".lock"))
			if err != nil {
				return 0, err
			}
			defer holder.kill()
			if _, err := holder.line(ctx, time.Minute); err != nil {
				return 0, fmt.Errorf("holder on host A: %w", err)
			}
			waiter, err := r.startLineProc(fmt.Sprintf("gcs-waiter%d", g.seq), "lock", "-file", filepath.Join(m[1].dir, gcsLock, ".lock"))
			if err != nil {
				return 0, err
			}
			defer waiter.stop()
			// Let the waiter block, and the holder's daemon refresh at least once.
			time.Sleep(g.refreshInterval * 3 / 2)
			if waiter.ready() {
				return 0, errors.New("host B was granted the lock while host A's daemon lived")
			}
			killed, killedAt := monoNow(), time.Now()
			if err := m[0].cmd.Process.Kill(); err != nil {
				return 0, err
			}
			beat, err := g.lastHeartbeat(prefix, fmt.Sprintf("gcs-a%d", g.seq))
			if err != nil {
				return 0, err
			}
			sinceBeat = killedAt.Sub(beat)
			b, err := waiter.line(ctx, 10*g.ttl+30*time.Second)
			if err != nil {
				return 0, fmt.Errorf("waiter on host B: %w", err)
			}
			var out struct {
				GrantedNs float64 `json:"granted_ns"`
			}
			if err := json.Unmarshal(b, &out); err != nil {
				return 0, fmt.Errorf("waiter on host B: %q: %w", b, err)
			}
			return time.Duration(int64(out.GrantedNs) - killed), nil
		}()
		if err != nil {
			return err
		}
		g.addTakeover(rep, d, sinceBeat)
	}
	return nil
}

// lastHeartbeat returns when the last write to a session object of host
// (under prefix) landed at the proxy. It waits TTL/2 first, so that a
// heartbeat the host sent just before it died is counted, while the
// waiter, which declares the session dead (a write to the same object) only
// once it has seen it unchanged for a TTL, has not written yet.
func (g *gcsRun) lastHeartbeat(prefix, host string) (time.Time, error) {
	time.Sleep(g.ttl / 2)
	sessions := gcsBucket + "/" + prefix + "sessions/" + host + "."
	var last time.Time
	for name := range g.proxy.Traffic().Objects {
		if at, ok := g.proxy.LastWrite(name); ok && strings.HasPrefix(name, sessions) && at.After(last) {
			last = at
		}
	}
	if last.IsZero() {
		return last, fmt.Errorf("no session write of host %s landed at the proxy (objects %s*)", host, sessions)
	}
	return last, nil
}

// addTakeover records one takeover: d from the kill of the holder until
// the waiter held the lock, sinceBeat from the holder's last heartbeat to
// the kill.
func (g *gcsRun) addTakeover(rep int, d, sinceBeat time.Duration) {
	bound := g.ttl + g.lockDelay()
	g.takeoverS = append(g.takeoverS, (d + sinceBeat - bound).Seconds())
	g.takeoverKillS = append(g.takeoverKillS, (d - bound).Seconds())
	how := "engines"
	if g.daemons {
		how = "daemons"
	}
	g.r.logf("gcs takeover (%s) rep %d: %.3fs after the holder's last heartbeat, %.3fs after the kill (TTL %v, lock-delay %v)",
		how, rep, (d + sinceBeat).Seconds(), d.Seconds(), g.ttl, g.lockDelay())
}

// lockDelay is the holders' lock-delay: the default, the TTL.
func (g *gcsRun) lockDelay() time.Duration { return g.ttl }

// monoNow reads CLOCK_MONOTONIC in nanoseconds, as loadgen does.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// soloProcs is a process tree where every thread id is a process of its
// own with no ancestors: the engine's clients are strangers to each other.
type soloProcs struct{}

func (soloProcs) Lineage(tid int) (lockmgr.Lineage, error) {
	return lockmgr.Lineage{{PID: tid, Start: 1}}, nil
}
func (soloProcs) Alive(lockmgr.ProcID) bool { return true }

// The holder host: this same binary, re-executed with helperEnv set.

const (
	helperEnv        = "LOCKFS_BENCH_HELPER"
	helperGCSHolder  = "gcs-holder"
	helperEtcdHolder = "etcd-holder"
)

// startGCSHolder re-executes this binary as a holder host and waits until
// it holds lock exclusively.
func (r *runner) startGCSHolder(ctx context.Context, cfg gcsbackend.Config, lock string) (*background, error) {
	return r.startHolderHost(ctx, cfg.HostID, helperGCSHolder,
		"LOCKFS_BENCH_GCS="+strings.Join([]string{cfg.Endpoint, cfg.Bucket, cfg.Prefix, cfg.HostID, cfg.TTL.String(), lock}, "\x1f"))
}

// startHolderHost re-executes this binary as the holder host helper (with
// env, its configuration) and waits until it says it holds its lock.
func (r *runner) startHolderHost(ctx context.Context, name, helper, env string) (*background, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-test.run=^$") // harmless if self is a test binary
	cmd.Env = append(os.Environ(), helperEnv+"="+helper, env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(r.logDir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b := &background{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
		io.Copy(io.Discard, stdout)
		b.err = cmd.Wait()
		close(b.done)
	}()
	select {
	case s := <-line:
		if !strings.HasPrefix(s, "held") {
			b.stop(time.Second)
			return nil, fmt.Errorf("%s: %q: %s", helper, s, b.logTail())
		}
		return b, nil
	case <-time.After(time.Minute):
		b.stop(time.Second)
		return nil, fmt.Errorf("%s did not take the lock within a minute: %s", helper, b.logTail())
	case <-ctx.Done():
		b.stop(time.Second)
		return nil, ctx.Err()
	}
}

// HelperMain runs the harness's helper processes: a binary that calls Run
// must call HelperMain first thing in main (or TestMain), because Run
// re-executes that binary as a GCS holder host. It returns at once when
// the process is not a helper.
func HelperMain() {
	switch os.Getenv(helperEnv) {
	case "":
		return
	case helperGCSHolder:
		err := gcsHolder()
		fmt.Fprintln(os.Stderr, "gcs holder:", err)
		os.Exit(1)
	case helperEtcdHolder:
		err := etcdHolder()
		fmt.Fprintln(os.Stderr, "etcd holder:", err)
		os.Exit(1)
	case helperSimHosts:
		if err := simHosts(); err != nil {
			fmt.Fprintln(os.Stderr, "sim hosts:", err)
			os.Exit(1)
		}
		os.Exit(0)
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", helperEnv, os.Getenv(helperEnv))
		os.Exit(2)
	}
}

// gcsHolder takes the lock exclusively through its own backend and engine,
// prints "held", and holds it until killed.
func gcsHolder() error {
	f := strings.Split(os.Getenv("LOCKFS_BENCH_GCS"), "\x1f")
	if len(f) != 6 {
		return fmt.Errorf("bad LOCKFS_BENCH_GCS %q", os.Getenv("LOCKFS_BENCH_GCS"))
	}
	ttl, err := time.ParseDuration(f[4])
	if err != nil {
		return err
	}
	b, err := gcsbackend.New(context.Background(), gcsbackend.Config{Endpoint: f[0], Bucket: f[1], Prefix: f[2], HostID: f[3], TTL: ttl})
	if err != nil {
		return err
	}
	return holdUntilKilled(b, f[5])
}

// holdUntilKilled takes lock exclusively through an engine over b, prints
// "held", and holds it until the process is killed.
func holdUntilKilled(b lockmgr.Backend, lock string) error {
	e, err := engineOver(b, nil)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.Acquire(actx, gcsRequest(lock, 1, false)); err != nil {
		return err
	}
	fmt.Println("held")
	select {} // until SIGKILL
}
