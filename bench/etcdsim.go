package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// etcdSimKeys are the goal keys of etcdsim.
var etcdSimKeys = []string{"etcd_sim_1000_hosts_requests_per_s", "etcd_sim_1000_hosts_losses"}

// etcdSim (make bench-scale): the gcs sim's fleet on etcd, through the same
// helper processes (simhosts.go) and sizes (Config.GCSSimHosts hosts ×
// GCSSimLocks exclusive locks "s<j%4>/h<i>-k<j>", GCSSimProcs processes,
// GCSSimSetup, GCSSimDur): each host is an etcd backend with its own
// client (one connection), session lease and wants watch, and an engine
// over it, default TTL (30 s) and lock-delay, as a real host's daemon is;
// one member on loopback with its data on tmpfs (etcd's WAL fsyncs on
// this VM's disk would measure the disk). The hosts take their locks
// within the setup, then hold them for GCSSimDur, counted at the server:
// the member's gRPC metrics (grpc_server_msg_received_total on /metrics,
// every request message it received: unary calls, each keep-alive, watch
// creations), before and after; and by the hosts' backends
// (etcdbackend.Stats). Then the hosts close, a few at a time per process.
//
// Keys: etcd_sim_1000_hosts_requests_per_s (server, idle),
// etcd_sim_1000_hosts_losses (holds lost from the first acquire to the
// close), etcd_sim_keepalives_per_s (server: LeaseKeepAlive messages),
// etcd_sim_backend_requests_per_s and etcd_sim_backend_keepalives_per_s
// (the hosts' own counts), etcd_sim_setup_s, etcd_sim_close_s,
// etcd_sim_sessions_lost (during the steady window), etcd_sim_member_fds
// (the member's descriptors at its end: a connection per host),
// etcd_sim_setup_requests (server; at least one per lock, or the count is
// wrong and the measurement fails). Null with etcd_sim_unavailable_reason
// if etcd is not installed or not every lock is held within the setup
// bound.
func (r *runner) etcdSim(ctx context.Context) error {
	bin := r.etcdServer("etcd_sim", etcdSimKeys)
	if bin == "" {
		return nil
	}
	c, _, stop, err := r.launchEtcd(bin, "etcd-sim")
	if err != nil {
		return err
	}
	defer stop()
	metrics := c.Endpoints()[0] + "/metrics"
	n, per, nproc := r.cfg.GCSSimHosts, r.cfg.GCSSimLocks, min(r.cfg.GCSSimProcs, r.cfg.GCSSimHosts)
	res := r.res
	procs, err := r.startSims("etcd-sim", simSpec{backend: "etcd", endpoint: strings.Join(c.Endpoints(), ","),
		prefix: "sim/", locks: per}, n, nproc)
	if err != nil {
		return err
	}
	defer procs.kill()
	before, err := etcdServerRequests(ctx, metrics)
	if err != nil {
		return err
	}
	setup, ok := procs.take(ctx, r, "etcd_sim", etcdSimKeys, n*per, r.cfg.GCSSimSetup)
	res.set("etcd_sim_setup_s", setup.Seconds())
	if !ok {
		return nil
	}
	// The control of the server's count: every lock is a claim
	// transaction the member received.
	after, err := etcdServerRequests(ctx, metrics)
	if err != nil {
		return err
	}
	if d := after.messages - before.messages; d < float64(n*per) {
		return fmt.Errorf("etcd sim: the member counted %.0f requests while %d locks were claimed: %s does not count what the hosts send", d, n*per, metrics)
	}
	res.set("etcd_sim_setup_requests", after.messages-before.messages)

	s, h, secs, err := etcdSimIdle(ctx, procs, metrics, r.cfg.GCSSimDur)
	if err != nil {
		return err
	}
	lost, closeS, err := procs.close(ctx)
	if err != nil {
		return err
	}

	reqS, kaS := s.messages/secs, s.keepAlives/secs
	res.set("etcd_sim_1000_hosts_requests_per_s", reqS)
	res.set("etcd_sim_1000_hosts_losses", lost)
	res.set("etcd_sim_keepalives_per_s", kaS)
	res.set("etcd_sim_backend_requests_per_s", h[0]/secs)
	res.set("etcd_sim_backend_keepalives_per_s", h[1]/secs)
	res.set("etcd_sim_sessions_lost", h[5])
	res.set("etcd_sim_close_s", closeS)
	res.set("etcd_sim_member_fds", s.openFDs)
	r.logf("etcd sim: idle %.1fs: server %s requests/s (%s keep-alives/s), hosts counted %s/s (%s keep-alives/s, %.0f failures); closed in %.1fs; %.0f holds lost, %.0f sessions lost; the member had %.0f descriptors",
		secs, fmtNum(reqS), fmtNum(kaS), fmtNum(h[0]/secs), fmtNum(h[1]/secs), h[4], closeS, lost, h[5], s.openFDs)

	r.etcdSimRows(fmt.Sprintf("%d hosts × %d locks in %d processes, default TTL, %v steady", n, per, nproc, r.cfg.GCSSimDur),
		fmt.Sprintf("keep-alives %s/s; setup %s s", fmtNum(kaS), fmtNum(setup.Seconds())), fmt.Sprintf("closed in %s s", fmtNum(closeS)))
	return nil
}

// etcdSimRows adds the table's rows of the etcd sim's keys: what it ran,
// and notes for the requests' and the losses' rows. The reference is the
// gcs sim's requests, if it ran in this run.
func (r *runner) etcdSimRows(what, reqNote, lostNote string) {
	res := r.res
	ref := "gcs sim not measured in this run"
	if w, ok := res.Value("gcs_sim_1000_hosts_writes_per_s"); ok {
		ref = fmt.Sprintf("gcs sim: %s writes/s", fmtNum(w))
		if rd, ok := res.Value("gcs_sim_reads_per_s"); ok {
			ref += fmt.Sprintf(" + %s reads/s", fmtNum(rd))
		}
	}
	atMost150, zero := atMost(150), equal(0)
	for _, k := range []struct {
		name, key, ref string
		g              *goal
	}{
		{"etcd sim: requests/s the member received, " + what, "etcd_sim_1000_hosts_requests_per_s", ref + "; " + reqNote, &atMost150},
		{"etcd sim: holds lost (setup to close)", "etcd_sim_1000_hosts_losses", lostNote, &zero},
	} {
		v, _ := res.Value(k.key)
		gt, met := res.met(k.key, k.g)
		res.addRow(Row{k.name, fmtNum(v), k.ref, "", gt, met})
	}
}

// etcdSimIdle counts the requests of the sim's hosts, holding their locks,
// for dur: at the server (metrics: its /metrics URL) and by the hosts, and
// returns the counts and the seconds they were counted over.
func etcdSimIdle(ctx context.Context, procs simProcs, metrics string, dur time.Duration) (etcdServerCount, []float64, float64, error) {
	counts := func() (server etcdServerCount, hosts []float64, err error) {
		if server, err = etcdServerRequests(ctx, metrics); err != nil {
			return server, nil, err
		}
		hosts, err = procs.askAll(ctx, "stats", "stats")
		return server, hosts, err
	}
	s0, h0, err := counts()
	if err != nil {
		return etcdServerCount{}, nil, 0, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return etcdServerCount{}, nil, 0, ctx.Err()
	case <-time.After(dur):
	}
	s1, h1, err := counts()
	if err != nil {
		return etcdServerCount{}, nil, 0, err
	}
	for i := range h1 {
		h1[i] -= h0[i]
	}
	return etcdServerCount{s1.messages - s0.messages, s1.keepAlives - s0.keepAlives, s1.openFDs}, h1, time.Since(t0).Seconds(), nil
}

// newEtcdSimHost is a sim host on etcd: a backend of its own (client,
// session) and an engine over it. Its stats: requests, keep-alives,
// claim transactions, reads, failures, sessions lost.
func newEtcdSimHost(_ context.Context, spec simSpec, id string, lost *atomic.Int64) (simHost, error) {
	b, err := etcdbackend.New(etcdbackend.Config{Endpoints: strings.Split(spec.endpoint, ","), Prefix: spec.prefix, HostID: id,
		Logger: simLogger()})
	if err != nil {
		return simHost{}, err
	}
	e, err := engineOver(b, func(lockmgr.LostHold) { lost.Add(1) })
	if err != nil {
		b.Close()
		return simHost{}, err
	}
	return simHost{e, func() []uint64 {
		s := b.Stats()
		return []uint64{s.Requests, s.KeepAlives, s.Txns, s.Reads, s.Failures, s.SessionsLost}
	}}, nil
}

// etcdServerCount is what an etcd member counted of the requests it
// received.
type etcdServerCount struct {
	messages   float64 // grpc_server_msg_received_total, every method
	keepAlives float64 // the same, LeaseKeepAlive
	openFDs    float64 // process_open_fds: its descriptors now
}

// etcdServerRequests reads an etcd member's gRPC request counts from its
// Prometheus metrics (url: its client URL + "/metrics").
func etcdServerRequests(ctx context.Context, url string) (etcdServerCount, error) {
	var c etcdServerCount
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return c, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "process_open_fds "); ok {
			c.openFDs, _ = strconv.ParseFloat(v, 64)
			continue
		}
		if !strings.HasPrefix(line, "grpc_server_msg_received_total{") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			return c, fmt.Errorf("GET %s: %q: %w", url, line, err)
		}
		found = true
		c.messages += v
		if strings.Contains(line[:sp], `grpc_method="LeaseKeepAlive"`) {
			c.keepAlives += v
		}
	}
	if err := sc.Err(); err != nil {
		return c, err
	}
	if !found {
		return c, fmt.Errorf("GET %s: no grpc_server_msg_received_total", url)
	}
	return c, nil
}
