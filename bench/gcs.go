package bench

import (
	"context"
	"errors"
	"fmt"
	"time"
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
