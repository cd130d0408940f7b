package bench

// Takeovers: how long after a host dies (SIGKILL) another takes its lock,
// engine to engine and daemon to daemon.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

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
