package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// The sims' hosts (gcssim, etcdsim) run in helper processes
// (helperSimHosts), each a slice of the hosts, so that a thousand
// backends, their engines and clients are not all in the harness's
// process. The harness talks to each over its standard input and output,
// one command and one answer line at a time:
//
//	take DUR        -> "took HELD FAILED LOST SECONDS"  every host takes its locks, for at most DUR
//	churn DUR EVERY -> "churned CYCLES FAILED LOST"     every EVERY, for DUR: release every lock, take it
//	                                                   again half a period later
//	stats           -> "stats N..."                     the requests the hosts' backends counted so far
//	                                                   (simBackends says which)
//	close           -> "closed LOST SECONDS"            close every host, a few at a time; then exit
//
// LOST counts the holds the hosts' engines reported lost so far. While it
// takes its locks, a helper also prints "progress HELD" every 30 s. The
// requests are counted by the hosts' backends (gcsbackend.Stats: every
// request sent, retries included, a listing per page; etcdbackend.Stats),
// so that no proxy stands between a thousand clients and the server.

const helperSimHosts = "sim-hosts"

// simWorkers are, per backend, the acquires each helper has in flight
// during the setup and the hosts it closes at once. gcs: each close drops
// its records (one write each), and a thousand hosts closing at once would
// open connections by the thousand. etcd: the one member applies every
// claim and every close (a LeaseRevoke that deletes the host's keys), and
// it answers a keep-alive only once its apply has caught up (etcd commit
// fef4a79): hundreds of requests queued on a loaded member delay every
// host's keep-alives past their validity (docs/BENCHMARKS.md, "At
// scale"), so fewer at once.
var simWorkers = map[string]struct{ take, close int }{"gcs": {32, 8}, "etcd": {8, 1}}

// simLogger is a sim host backend's logger: warnings and errors (a failed
// heartbeat or keep-alive, a lost session) go to the helper's log
// (standard error), so that a loss in the sim says why.
func simLogger() logrus.FieldLogger {
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	return log
}

// simSpec is what a sim helper process needs, passed in its environment.
type simSpec struct {
	// backend is a key of simBackends; endpoint is the GCS emulator's, or
	// the etcd endpoints, comma-separated; bucket is GCS's only.
	backend, endpoint, bucket, prefix string
	first, hosts, locks               int
}

func (s simSpec) env() string {
	return "LOCKFS_BENCH_SIM=" + strings.Join([]string{s.backend, s.endpoint, s.bucket, s.prefix,
		strconv.Itoa(s.first), strconv.Itoa(s.hosts), strconv.Itoa(s.locks)}, "\x1f")
}

func parseSimSpec(v string) (simSpec, error) {
	f := strings.Split(v, "\x1f")
	if len(f) != 7 || simBackends[f[0]] == nil {
		return simSpec{}, fmt.Errorf("bad LOCKFS_BENCH_SIM %q", v)
	}
	s := simSpec{backend: f[0], endpoint: f[1], bucket: f[2], prefix: f[3]}
	var err error
	for i, p := range []*int{&s.first, &s.hosts, &s.locks} {
		if *p, err = strconv.Atoi(f[4+i]); err != nil {
			return simSpec{}, fmt.Errorf("bad LOCKFS_BENCH_SIM %q: %w", v, err)
		}
	}
	return s, nil
}

// simLock is lock j of sim host i: every host's locks sit under the same
// few parents.
func simLock(i, j int) string { return fmt.Sprintf("s%d/h%d-k%d", j%simParents, i, j) }

// simHost is one host of a sim helper: its engine, and the request counts
// of its backend.
type simHost struct {
	e     *lockmgr.Engine
	stats func() []uint64
}

// simBackends makes a sim host of each backend: a backend of its own
// (session, client) with host id id, and an engine over it that counts
// its lost holds in lost.
var simBackends = map[string]func(ctx context.Context, spec simSpec, id string, lost *atomic.Int64) (simHost, error){
	// stats: reads, writes, lists, deletes
	"gcs": func(ctx context.Context, spec simSpec, id string, lost *atomic.Int64) (simHost, error) {
		h, err := newClientHost(ctx, gcsbackend.Config{Bucket: spec.bucket, Endpoint: spec.endpoint,
			Prefix: spec.prefix, HostID: id, Logger: simLogger()}, lost)
		if err != nil {
			return simHost{}, err
		}
		return simHost{h.e, func() []uint64 {
			s := h.b.Stats()
			return []uint64{s.Reads, s.Writes, s.Lists, s.Deletes}
		}}, nil
	},
	"etcd": newEtcdSimHost,
}

// simHosts is the helper process: it runs the hosts of its spec and
// answers the harness's commands until "close".
func simHosts() error {
	spec, err := parseSimSpec(os.Getenv("LOCKFS_BENCH_SIM"))
	if err != nil {
		return err
	}
	sh := &simHelper{ctx: context.Background(), spec: spec, hosts: make([]simHost, spec.hosts)}
	for k := range sh.hosts {
		if sh.hosts[k], err = simBackends[spec.backend](sh.ctx, spec, fmt.Sprintf("sim-h%d", spec.first+k), &sh.lost); err != nil {
			return err
		}
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd := strings.Fields(in.Text())
		if len(cmd) == 0 {
			continue
		}
		start := time.Now()
		switch {
		case cmd[0] == "take" && len(cmd) == 2:
			err = sh.take(cmd[1], start)
		case cmd[0] == "stats":
			sh.stats()
		case cmd[0] == "churn" && len(cmd) == 3:
			err = sh.churn(cmd[1], cmd[2], start)
		case cmd[0] == "close":
			sh.close(start)
			return nil
		default:
			return fmt.Errorf("bad command %q", in.Text())
		}
		if err != nil {
			return err
		}
	}
	return in.Err()
}

// simHelper is a sim helper process's hosts, and the holds their engines
// reported lost so far.
type simHelper struct {
	ctx   context.Context
	spec  simSpec
	hosts []simHost
	lost  atomic.Int64
}

// each runs f on every (host, lock) pair, simWorkers' take at a time, and
// counts the failures.
func (sh *simHelper) each(f func(h simHost, i, j int) error) (failed int64, first error) {
	var mu sync.Mutex
	parallel(sh.ctx, sh.spec.hosts*sh.spec.locks, simWorkers[sh.spec.backend].take, func(n int) error {
		k, j := n%sh.spec.hosts, n/sh.spec.hosts
		if err := f(sh.hosts[k], sh.spec.first+k, j); err != nil {
			mu.Lock()
			failed++
			if first == nil {
				first = err
			}
			mu.Unlock()
		}
		return nil
	})
	return failed, first
}

func (sh *simHelper) acquire(h simHost, i, j int) error {
	actx, cancel := context.WithTimeout(sh.ctx, time.Minute)
	defer cancel()
	_, err := h.e.Acquire(actx, gcsRequest(simLock(i, j), j+1, true))
	return err
}

func (sh *simHelper) release(h simHost, i, j int) error {
	rctx, cancel := context.WithTimeout(sh.ctx, time.Minute)
	defer cancel()
	req := gcsRequest(simLock(i, j), j+1, true)
	return h.e.Release(rctx, req.Lock, req.Owner)
}

// take answers "take DUR": every host takes its locks, for at most DUR,
// printing its progress every 30 s.
func (sh *simHelper) take(dur string, start time.Time) error {
	bound, err := time.ParseDuration(dur)
	if err != nil {
		return err
	}
	tctx, cancel := context.WithTimeout(sh.ctx, bound)
	var held atomic.Int64
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				fmt.Printf("progress %d\n", held.Load())
			}
		}
	}()
	failed, first := sh.each(func(h simHost, i, j int) error {
		if tctx.Err() != nil {
			return tctx.Err()
		}
		actx, acancel := context.WithTimeout(tctx, time.Minute)
		defer acancel()
		if _, err := h.e.Acquire(actx, gcsRequest(simLock(i, j), j+1, true)); err != nil {
			return err
		}
		held.Add(1)
		return nil
	})
	cancel()
	close(stop)
	if first != nil {
		fmt.Fprintln(os.Stderr, "take: first failure:", first)
	}
	fmt.Printf("took %d %d %d %.3f\n", held.Load(), failed, sh.lost.Load(), time.Since(start).Seconds())
	return nil
}

// stats answers "stats": the requests the hosts' backends counted so far.
func (sh *simHelper) stats() {
	var sum []uint64
	for _, h := range sh.hosts {
		st := h.stats()
		if sum == nil {
			sum = make([]uint64, len(st))
		}
		for i, n := range st {
			sum[i] += n
		}
	}
	fmt.Print("stats")
	for _, n := range sum {
		fmt.Printf(" %d", n)
	}
	fmt.Println()
}

// churn answers "churn DUR EVERY". Each cycle: release every lock, leave
// them released (warm) for half the period, take them all again and hold
// them for the other half.
func (sh *simHelper) churn(durS, everyS string, start time.Time) error {
	dur, err1 := time.ParseDuration(durS)
	every, err2 := time.ParseDuration(everyS)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	var cycles, failed int64
	for time.Since(start) < dur {
		t0 := time.Now()
		f1, e1 := sh.each(sh.release)
		time.Sleep(every/2 - time.Since(t0))
		f2, e2 := sh.each(sh.acquire)
		if e := errors.Join(e1, e2); e != nil {
			fmt.Fprintln(os.Stderr, "churn:", e)
		}
		cycles++
		failed += f1 + f2
		time.Sleep(every - time.Since(t0))
	}
	fmt.Printf("churned %d %d %d\n", cycles, failed, sh.lost.Load())
	return nil
}

// close answers "close": every host closed, a few at a time.
func (sh *simHelper) close(start time.Time) {
	parallel(sh.ctx, len(sh.hosts), simWorkers[sh.spec.backend].close, func(k int) error {
		sh.hosts[k].e.Close() // a release that failed expires after its TTL
		return nil
	})
	fmt.Printf("closed %d %.3f\n", sh.lost.Load(), time.Since(start).Seconds())
}
