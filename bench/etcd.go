package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/etcdbackend/etcdtest"
	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// etcd: the etcd backend, in this process, on a one-member etcd server
// (Debian's etcd-server) on loopback, and the references measured in the
// same run.
//
// Keys:
//   - etcd_handoff_cross_host_p99_ms, _p50_ms: from host A's release of an
//     exclusive claim on gcsLock (depth 4) to the grant of host B's claim,
//     which was waiting for it (A saw its want); the hosts swap roles each
//     time. The member keeps its data on tmpfs (/dev/shm) when there is
//     one: a hand-off is two writes, each an fsync of etcd's log, and on
//     a shared VM's disk those take up to hundreds of ms under other
//     loads; tmpfs measures the protocol and the server, not this disk.
//     etcd_handoff_disk_p99_ms, _p50_ms: the same with the member's data
//     on the run's work directory (a disk). Reference
//     gcs_handoff_cross_host_p99_ms: the same between two gcs backends on
//     the GCS emulator (fewer hand-offs: each takes about a poll).
//   - etcd_acquire_ms_depth4 (_min, _max): a cold, uncontended exclusive
//     claim of a fresh depth-4 lock, the session running. Reference
//     etcd_mutex_lock_ms: concurrency.Mutex.Lock of a fresh key, its
//     session running: what `etcdctl lock` does, one flat key.
//   - etcd_takeover_s_minus_ttl_and_delay: a holder host (a helper process
//     on etcd, TTL 3s, lock-delay 3s) is killed with SIGKILL while a host
//     here waits for its lock: from the server's expiry of the holder's
//     session lease (its last keep-alive + TTL + lock-delay, read from the
//     server) to the waiter's grant, over min(GCSReps, 3) kills;
//     etcd_takeover_s_after_kill_minus_ttl_and_delay: from the kill, less
//     TTL + lock-delay (negative: the last keep-alive came before the kill).
//   - etcd_fleet_acquires_per_s: GCSFleetHosts hosts (engines over etcd
//     backends) churn their own locks under one parent, as the gcs fleet
//     does, for GCSFleetDur/6; etcd_fleet_lease_losses, the holds lost;
//     etcd_fleet_requests_per_s, every request of the hosts (keep-alives
//     included). Reference: gcs_fleet_acquires_per_s if the gcs fleet ran
//     in the same run (it runs before etcd), else the gcs goal (500).
//   - etcd_requests_per_acquire_depth4: the requests of that claim;
//     etcd_requests_per_warm_reacquire: of a release and re-claim on the
//     same host with nobody else wanting the lock (keep-alives apart).
func (r *runner) etcd(ctx context.Context) error {
	bin := r.etcdServer("etcd", etcdKeys)
	if bin == "" {
		return nil
	}
	c, onTmpfs, stop, err := r.launchEtcd(bin, "etcd")
	if err != nil {
		return err
	}
	defer stop()
	e := &etcdRun{r: r, bin: bin, eps: c.Endpoints(), onTmpfs: onTmpfs}
	for _, step := range []func(context.Context) error{e.acquire, e.mutex, e.handoff, e.handoffDisk, e.gcsHandoff, e.takeover, e.fleet} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	e.report()
	return nil
}

// etcdServer returns the etcd server's path, or "" after nulling keys
// under what if it is not installed.
func (r *runner) etcdServer(what string, keys []string) string {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		r.nullKeys(what, keys, fmt.Sprintf("the etcd server is not installed (apt-get install etcd-server; make deps installs it): %v", err))
		return ""
	}
	return bin
}

// launchEtcd starts a one-member etcd server on loopback with its data on
// tmpfs (/dev/shm) if there is one, else in the run's directory name. stop
// stops it and removes its data from tmpfs.
func (r *runner) launchEtcd(bin, name string) (c *etcdtest.Cluster, onTmpfs bool, stop func(), err error) {
	dataDir, rm := filepath.Join(r.work, name), func() {}
	if d, err := os.MkdirTemp("/dev/shm", "lockfs-bench-"+name+"-"); err == nil {
		dataDir, onTmpfs, rm = d, true, func() { os.RemoveAll(d) }
	}
	if c, err = etcdtest.Launch(bin, dataDir, 1); err != nil {
		rm()
		return nil, false, nil, err
	}
	return c, onTmpfs, func() { c.Stop(); rm() }, nil
}

// etcdKeys are the keys the etcd measurement produces.
var etcdKeys = []string{
	"etcd_handoff_cross_host_p99_ms", "etcd_handoff_cross_host_p50_ms", "gcs_handoff_cross_host_p99_ms",
	"etcd_handoff_disk_p99_ms", "etcd_handoff_disk_p50_ms",
	"etcd_takeover_s_minus_ttl_and_delay", "etcd_takeover_s_after_kill_minus_ttl_and_delay",
	"etcd_fleet_acquires_per_s", "etcd_fleet_lease_losses", "etcd_fleet_requests_per_s",
	"etcd_acquire_ms_depth4", "etcd_mutex_lock_ms",
	"etcd_requests_per_acquire_depth4", "etcd_requests_per_warm_reacquire",
}

// etcdRun is the state of the etcd measurement.
type etcdRun struct {
	r       *runner
	bin     string   // the etcd server
	eps     []string // the member's endpoints
	onTmpfs bool     // its data is on tmpfs
	seq     int

	acquireMs, mutexMs, handoffMs, diskHandoffMs, gcsHandoffMs []float64
	takeoverS, takeoverKillS                                   []float64

	fleetHosts                            int
	fleetDur                              float64 // s
	fleetAcquires, fleetFailed, fleetLost int64
	fleetRequests                         uint64
	fleetLat                              []float64 // ms, sorted
	reqAcquire, reqWarm                   []float64
}

// reps is the number of repetitions of the cheap steps.
func (e *etcdRun) reps() int { return 20 * e.r.cfg.GCSReps }

func (e *etcdRun) backend(prefix string) (*etcdbackend.Backend, error) {
	return e.backendOn(e.eps, prefix)
}

func (e *etcdRun) backendOn(eps []string, prefix string) (*etcdbackend.Backend, error) {
	e.seq++
	return etcdbackend.New(etcdbackend.Config{Endpoints: eps, Prefix: prefix, TTL: 10 * time.Second,
		HostID: fmt.Sprintf("bench-%d", e.seq)})
}

func etcdClaim(ctx context.Context, b lockmgr.Backend, path string, wait bool) (lockmgr.Lease, error) {
	return b.Claim(ctx, lockmgr.LockID{Path: path, Kind: lockmgr.KindDir}, lockmgr.Exclusive, wait)
}

// quiet is the requests so far, keep-alives apart.
func quiet(b *etcdbackend.Backend) float64 {
	s := b.Stats()
	return float64(s.Requests - s.KeepAlives)
}

// acquire: cold claims of fresh depth-4 locks, then warm rounds of one.
func (e *etcdRun) acquire(ctx context.Context) error {
	b, err := e.backend("bench-acquire/")
	if err != nil {
		return err
	}
	defer b.Close()
	l, err := etcdClaim(ctx, b, "start", false) // starts the session
	if err != nil {
		return err
	}
	l.Release(ctx)
	for i := range e.reps() {
		path := fmt.Sprintf("r%d/b/c/d", i)
		n0, t0 := quiet(b), time.Now()
		l, err := etcdClaim(ctx, b, path, false)
		if err != nil {
			return err
		}
		e.acquireMs = append(e.acquireMs, float64(time.Since(t0).Microseconds())/1000)
		e.reqAcquire = append(e.reqAcquire, quiet(b)-n0)
		l.Release(ctx)
		n0 = quiet(b)
		if l, err = etcdClaim(ctx, b, path, false); err != nil {
			return err
		}
		l.Release(ctx)
		e.reqWarm = append(e.reqWarm, quiet(b)-n0)
	}
	return nil
}

// mutex: the reference, concurrency.Mutex.Lock of a fresh key.
func (e *etcdRun) mutex(ctx context.Context) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		return err
	}
	defer s.Close()
	for i := range e.reps() {
		m := concurrency.NewMutex(s, fmt.Sprintf("bench-mutex/%d", i))
		t0 := time.Now()
		if err := m.Lock(ctx); err != nil {
			return err
		}
		e.mutexMs = append(e.mutexMs, float64(time.Since(t0).Microseconds())/1000)
		if err := m.Unlock(ctx); err != nil {
			return err
		}
	}
	return nil
}

// handoff: hosts A and B pass gcsLock back and forth.
func (e *etcdRun) handoff(ctx context.Context) error {
	ms, err := e.handoffsOn(ctx, e.eps)
	e.handoffMs = ms
	return err
}

// handoffDisk: the same on a member with its data on disk (the run's work
// directory), if the first one's is on tmpfs.
func (e *etcdRun) handoffDisk(ctx context.Context) error {
	if !e.onTmpfs {
		e.diskHandoffMs = e.handoffMs
		return nil
	}
	c, err := etcdtest.Launch(e.bin, filepath.Join(e.r.work, "etcd-disk"), 1)
	if err != nil {
		return err
	}
	defer c.Stop()
	ms, err := e.handoffsOn(ctx, c.Endpoints())
	e.diskHandoffMs = ms
	return err
}

func (e *etcdRun) handoffsOn(ctx context.Context, eps []string) ([]float64, error) {
	var hosts [2]lockmgr.Backend
	for i := range hosts {
		b, err := e.backendOn(eps, "bench-handoff/")
		if err != nil {
			return nil, err
		}
		defer b.Close()
		hosts[i] = b
	}
	return crossHostHandoffs(ctx, hosts, e.reps())
}

// gcsHandoff: the reference, the same between two gcs backends on the
// emulator.
func (e *etcdRun) gcsHandoff(ctx context.Context) error {
	bin, err := emulatorBinary(ctx, e.r.modDir)
	if err != nil {
		e.r.logf("etcd: no gcs reference: cannot build the GCS emulator: %v", err)
		return nil
	}
	emu, err := startEmulator(ctx, bin, e.r.logDir, gcsBucket)
	if err != nil {
		return err
	}
	defer emu.stop(time.Second)
	var hosts [2]lockmgr.Backend
	for i := range hosts {
		b, err := gcsbackend.New(ctx, gcsbackend.Config{Bucket: gcsBucket, Prefix: "bench-handoff/",
			Endpoint: emu.url, TTL: 10 * time.Second, HostID: fmt.Sprintf("gcs-bench-%d", i)})
		if err != nil {
			return err
		}
		defer b.Close()
		hosts[i] = b
	}
	ms, err := crossHostHandoffs(ctx, hosts, max(2, e.r.cfg.GCSReps*2))
	e.gcsHandoffMs = ms
	return err
}

// crossHostHandoffs passes gcsLock n times between two hosts: the holder
// releases while the other waits for it; it returns each hand-off's time
// from the release call to the grant, in ms.
func crossHostHandoffs(ctx context.Context, hosts [2]lockmgr.Backend, n int) ([]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	held, err := etcdClaim(ctx, hosts[0], gcsLock, true)
	if err != nil {
		return nil, err
	}
	var out []float64
	for i := range n {
		next := hosts[(i+1)%2]
		type grant struct {
			l   lockmgr.Lease
			at  time.Time
			err error
		}
		got := make(chan grant, 1)
		go func() {
			l, err := etcdClaim(ctx, next, gcsLock, true)
			got <- grant{l, time.Now(), err}
		}()
		// The waiter is waiting: the holder saw its want, and its watch
		// has had time to start.
		if cl, ok := held.(lockmgr.ContendedLease); ok {
			select {
			case <-cl.Contended():
			case <-ctx.Done():
				return out, ctx.Err()
			}
		}
		time.Sleep(100 * time.Millisecond)
		t0 := time.Now()
		if err := held.Release(ctx); err != nil {
			return out, err
		}
		g := <-got
		if g.err != nil {
			return out, g.err
		}
		out = append(out, float64(g.at.Sub(t0).Microseconds())/1000)
		held = g.l
	}
	return out, held.Release(ctx)
}

func (e *etcdRun) report() {
	r := e.r
	put := func(key string, xs []float64) summary {
		s := summarize(xs)
		r.res.setSummary(key, s)
		return s
	}
	acq, mu := put("etcd_acquire_ms_depth4", e.acquireMs), put("etcd_mutex_lock_ms", e.mutexMs)
	reqA, reqW := put("etcd_requests_per_acquire_depth4", e.reqAcquire), put("etcd_requests_per_warm_reacquire", e.reqWarm)
	r.res.set("etcd_handoff_cross_host_p99_ms", percentile(e.handoffMs, 99))
	r.res.set("etcd_handoff_cross_host_p50_ms", percentile(e.handoffMs, 50))
	r.res.set("gcs_handoff_cross_host_p99_ms", percentile(e.gcsHandoffMs, 99))
	r.res.set("etcd_handoff_disk_p99_ms", percentile(e.diskHandoffMs, 99))
	r.res.set("etcd_handoff_disk_p50_ms", percentile(e.diskHandoffMs, 50))
	row := func(name, key, val, ref string, gl *goal) {
		gt, met := r.res.met(key, gl)
		r.res.addRow(Row{name, val, ref, "", gt, met})
	}
	p99, _ := r.res.Value("etcd_handoff_cross_host_p99_ms")
	p50, _ := r.res.Value("etcd_handoff_cross_host_p50_ms")
	g99, _ := r.res.Value("gcs_handoff_cross_host_p99_ms")
	d99, _ := r.res.Value("etcd_handoff_disk_p99_ms")
	d50, _ := r.res.Value("etcd_handoff_disk_p50_ms")
	where := "data on tmpfs"
	if !e.onTmpfs {
		where = "data on disk"
	}
	ten, three, two, zero := atMost(10), atMost(3), atMost(2), equal(0)
	row(fmt.Sprintf("etcd hand-off between 2 hosts, p99 ms (%d hand-offs, %s; p50 %s)", len(e.handoffMs), where, fmtNum(p50)),
		"etcd_handoff_cross_host_p99_ms", fmtNum(p99), fmt.Sprintf("gcs on the emulator: %s ms (%d)", fmtNum(g99), len(e.gcsHandoffMs)), &ten)
	row(fmt.Sprintf("etcd hand-off, member's data on this VM's disk, p99 ms (p50 %s)", fmtNum(d50)),
		"etcd_handoff_disk_p99_ms", fmtNum(d99), "", nil)
	row("etcd cold acquire, depth 4, ms", "etcd_acquire_ms_depth4", fmtSummary(acq, ""),
		fmt.Sprintf("concurrency.Mutex.Lock (etcdctl lock), 1 key: %s ms", fmtSummary(mu, "")), &three)
	row("etcd requests per cold acquire, depth 4", "etcd_requests_per_acquire_depth4", fmtSummary(reqA, ""), "", &two)
	to := put("etcd_takeover_s_minus_ttl_and_delay", e.takeoverS)
	tk := put("etcd_takeover_s_after_kill_minus_ttl_and_delay", e.takeoverKillS)
	inOne := between(0, 1)
	row(fmt.Sprintf("etcd takeover from the expiry of a kill -9'd holder's lease (last keep-alive + TTL + lock-delay; TTL %v, lock-delay %v), s", etcdTakeoverTTL, etcdTakeoverTTL),
		"etcd_takeover_s_minus_ttl_and_delay", fmtSummary(to, ""), fmt.Sprintf("from the kill: %s s", fmtSummary(tk, "")), &inOne)
	r.res.set("etcd_fleet_acquires_per_s", float64(e.fleetAcquires)/e.fleetDur)
	r.res.set("etcd_fleet_lease_losses", float64(e.fleetLost))
	r.res.set("etcd_fleet_requests_per_s", float64(e.fleetRequests)/e.fleetDur)
	r.res.set("etcd_fleet_failed_acquires", float64(e.fleetFailed))
	r.res.set("etcd_fleet_acquire_p99_ms", quantile(e.fleetLat, 0.99))
	fa, _ := r.res.Value("etcd_fleet_acquires_per_s")
	fleetGoal, fleetRef := atLeast(500), "gcs fleet not measured in this run"
	if g, ok := r.res.Value("gcs_fleet_acquires_per_s"); ok {
		fleetGoal = goal{"≥ gcs (" + fmtNum(g) + ")", func(v float64) bool { return v >= g }}
		fleetRef = fmt.Sprintf("gcs fleet: %s /s", fmtNum(g))
	}
	row(fmt.Sprintf("etcd fleet: acquires/s, %d hosts churning under one parent, %.0fs (p99 %s ms; %d failed; %s requests/s)",
		e.fleetHosts, e.fleetDur, fmtNum(quantile(e.fleetLat, 0.99)), e.fleetFailed, fmtNum(float64(e.fleetRequests)/e.fleetDur)),
		"etcd_fleet_acquires_per_s", fmtNum(fa), fleetRef, &fleetGoal)
	zeroLost := equal(0)
	row("etcd fleet: holds lost", "etcd_fleet_lease_losses", fmtNum(float64(e.fleetLost)), "", &zeroLost)
	row("etcd requests per warm re-acquire", "etcd_requests_per_warm_reacquire", fmtSummary(reqW, ""), "", &zero)
}
