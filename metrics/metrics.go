// Package metrics exposes lockfs's Prometheus metrics: lock waits, grants,
// conflicts, interrupted waits, deadlocks and permission refusals, locks
// held, lease losses and breaks, locks given up for a waiter outside, the
// build, and, through collector
// functions that other packages register, backend request counts and FUSE
// operation latency.
//
// Every counter and histogram is exported from the first scrape with each
// of its label sets at 0, so that an alert on increase(...) > 0 fires on the first event
// rather than on the second (a series that appears with the value 1 has
// not increased).
package metrics

import (
	"net/http"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lockfs/lockfs/lockmgr"
)

// Metrics holds one mount's metrics in its own registry.
type Metrics struct {
	reg *prometheus.Registry

	wait     *prometheus.HistogramVec
	requests *prometheus.CounterVec
	lost     *prometheus.CounterVec
	yields   *prometheus.CounterVec
	fuseOps  *prometheus.HistogramVec
}

// Compile-time check: Metrics observes the engine.
var _ lockmgr.Observer = (*Metrics)(nil)

// New makes the metrics. held, if not nil, is asked at every scrape for the
// locks currently held and waited for (lockmgr.Engine.Tally: counts, not a
// copy of the table).
func New(held func() lockmgr.Tally) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lockfs_lock_wait_seconds",
		Help:    "Time from a lock request to its answer, by lock kind, mode and outcome.",
		Buckets: WaitBuckets,
	}, []string{"kind", "mode", "outcome"})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockfs_lock_requests_total",
		Help: "Lock requests by kind, mode and outcome: granted, conflict (EWOULDBLOCK), deadlock (EDEADLK), " +
			"interrupted (EINTR, flock -w timeouts), denied (EACCES), failed (EINVAL, EIO, ENOLCK).",
	}, []string{"kind", "mode", "outcome"})
	m.lost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockfs_holds_lost_total",
		Help: "Holds marked lost, by kind and cause (lease = the backend lost the lease, break = an operator broke the lock).",
	}, []string{"kind", "cause"})
	m.yields = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockfs_lock_yields_total",
		Help: "Locks this daemon gave up, by kind, because someone outside it (another host, another daemon over " +
			"the same SOURCE, a program locking SOURCE directly) waited while local requests kept coming: " +
			"status said \"yielding\", the holds running finished and the lease went.",
	}, []string{"kind"})
	m.fuseOps = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lockfs_fuse_op_seconds",
		Help:    "Time to answer a FUSE request, by operation.",
		Buckets: []float64{.00001, .00005, .0001, .0005, .001, .005, .01, .05, .1, .5, 1},
	}, []string{"op"})
	m.reg.MustRegister(m.wait, m.requests, m.lost, m.yields, m.fuseOps,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, k := range kinds {
		for _, md := range modes {
			for _, o := range outcomes {
				m.requests.WithLabelValues(k.String(), md.String(), o.String())
				m.wait.WithLabelValues(k.String(), md.String(), o.String())
			}
		}
		for _, cause := range []string{causeLease, causeBreak} {
			m.lost.WithLabelValues(k.String(), cause)
		}
		m.yields.WithLabelValues(k.String())
	}
	if held != nil {
		m.reg.MustRegister(&heldCollector{tally: held, desc: prometheus.NewDesc("lockfs_locks_held",
			"Explicit holds of this host's processes that are not lost, by kind and mode "+
				"(the implicit shared holds on ancestors are not counted).",
			[]string{"kind", "mode"}, nil), waiters: prometheus.NewDesc("lockfs_lock_waiters",
			"Requests currently queued for a lock, by kind (a request waiting for an ancestor's "+
				"implicit hold counts under that ancestor's kind).", []string{"kind"}, nil)})
	}
	return m
}

// WaitBuckets are the upper bounds of lockfs_lock_wait_seconds, from 100 µs
// (an uncontended grant) to an hour (a job queued behind long builds), so
// that an alert on waits above 5, 10 or 30 minutes can fire.
var WaitBuckets = []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600}

// The label values every counter starts with.
var (
	kinds    = []lockmgr.Kind{lockmgr.KindDir, lockmgr.KindNewDir, lockmgr.KindUsage}
	modes    = []lockmgr.Mode{lockmgr.Shared, lockmgr.Exclusive}
	outcomes = []lockmgr.Outcome{lockmgr.Granted, lockmgr.Conflict, lockmgr.Deadlock, lockmgr.Interrupted,
		lockmgr.Denied, lockmgr.Failed}
)

// Causes of a lost hold, as lockfs_holds_lost_total labels them.
const (
	causeLease = "lease"
	causeBreak = "break"
)

// RegisterBuildInfo exports lockfs_build_info{version,go_version,backend} 1,
// so that dashboards can tell which build and backend a mount runs.
func (m *Metrics) RegisterBuildInfo(version, backend string) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockfs_build_info",
		Help: "Always 1; its labels name the lockfs version, the Go toolchain that built it and the mount's lock backend.",
	}, []string{"version", "go_version", "backend"})
	g.WithLabelValues(version, runtime.Version(), backend).Set(1)
	m.reg.MustRegister(g)
}

// Registry is where other packages register their collectors (backend
// request counts, for example).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Requested implements lockmgr.Observer.
func (m *Metrics) Requested(req lockmgr.Request, g lockmgr.Grant, outcome lockmgr.Outcome, took time.Duration) {
	labels := prometheus.Labels{"kind": req.Lock.Kind.String(), "mode": req.Mode.String(), "outcome": outcome.String()}
	m.requests.With(labels).Inc()
	m.wait.With(labels).Observe(took.Seconds())
}

// Lost implements lockmgr.Observer.
func (m *Metrics) Lost(id lockmgr.LockID, broken bool) {
	cause := causeLease
	if broken {
		cause = causeBreak
	}
	m.lost.WithLabelValues(id.Kind.String(), cause).Inc()
}

// Yielded implements lockmgr.Observer.
func (m *Metrics) Yielded(id lockmgr.LockID) {
	m.yields.WithLabelValues(id.Kind.String()).Inc()
}

// FUSEOp records how long one FUSE operation took.
func (m *Metrics) FUSEOp(op string, took time.Duration) {
	m.fuseOps.WithLabelValues(op).Observe(took.Seconds())
}

// heldCollector counts the engine's table at scrape time.
type heldCollector struct {
	tally   func() lockmgr.Tally
	desc    *prometheus.Desc
	waiters *prometheus.Desc
}

func (c *heldCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.waiters
}

func (c *heldCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.tally()
	for _, k := range kinds {
		for _, md := range modes {
			n := t.Held[lockmgr.KindMode{Kind: k, Mode: md}]
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k.String(), md.String())
		}
		ch <- prometheus.MustNewConstMetric(c.waiters, prometheus.GaugeValue, float64(t.Waiting[k]), k.String())
	}
}

// Count is one backend request counter: an operation (read, write), an
// outcome (ok, precondition_failed, rate_limited...) and its total.
type Count struct {
	Op, Outcome string
	N           uint64
}

// RegisterBackendRequests exposes lockfs_backend_requests_total{op,outcome}
// read from counts at every scrape (the gcs backend's request counters).
// counts must return every label set it will ever return, zeros included,
// from the first call on.
func (m *Metrics) RegisterBackendRequests(counts func() []Count) {
	m.reg.MustRegister(&countCollector{counts: counts, desc: prometheus.NewDesc("lockfs_backend_requests_total",
		"Requests the lock backend sent, by operation and outcome (for gcs: 412 = precondition_failed, 429 = rate_limited).",
		[]string{"op", "outcome"}, nil)})
}

type countCollector struct {
	counts func() []Count
	desc   *prometheus.Desc
}

func (c *countCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *countCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range c.counts() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n.N), n.Op, n.Outcome)
	}
}
