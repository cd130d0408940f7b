package metrics

import "github.com/prometheus/client_golang/prometheus"

// RegisterPassthrough exposes lockfs_passthrough{state}: 1 for the state
// the mount's FUSE passthrough is in ("on" or "off"), 0 for the other,
// read from on at every scrape (passthrough can turn off while mounted,
// when the kernel refuses a registration with EPERM). The mount's log
// says why it is off.
func (m *Metrics) RegisterPassthrough(on func() bool) {
	m.reg.MustRegister(&passthroughCollector{on: on, desc: prometheus.NewDesc("lockfs_passthrough",
		"1 for the state of FUSE passthrough of regular files (on: the kernel reads, writes and maps them directly; off: through the daemon).",
		[]string{"state"}, nil)})
}

type passthroughCollector struct {
	on   func() bool
	desc *prometheus.Desc
}

func (c *passthroughCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *passthroughCollector) Collect(ch chan<- prometheus.Metric) {
	on, off := 0.0, 1.0
	if c.on() {
		on, off = 1, 0
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, on, "on")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, off, "off")
}
