package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
)

// Results are the harness's named numbers and the rows of its table.
type Results struct {
	// values maps a key to its number; nil stands for JSON null.
	values map[string]*float64
	// notes are the few string-valued keys (gcs_unavailable_reason).
	notes map[string]string
	rows  []Row
}

// Row is one line of the table.
type Row struct {
	Name, Lockfs, Reference, Ratio, Goal, Met string
}

func newResults() *Results {
	return &Results{values: make(map[string]*float64), notes: make(map[string]string)}
}

// Set records key = v.
func (r *Results) set(key string, v float64) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		r.values[key] = nil
		return
	}
	r.values[key] = &v
}

// setNull records key = null.
func (r *Results) setNull(key string) { r.values[key] = nil }

// setSummary records key = median, key_min and key_max.
func (r *Results) setSummary(key string, s summary) {
	r.set(key, s.Med)
	r.set(key+"_min", s.Min)
	r.set(key+"_max", s.Max)
}

// Value returns key's number, and whether it is a number (not null, not
// missing).
func (r *Results) Value(key string) (float64, bool) {
	v, ok := r.values[key]
	if !ok || v == nil {
		return 0, false
	}
	return *v, true
}

// Has reports whether key was recorded (as a number or as null).
func (r *Results) Has(key string) bool {
	_, ok := r.values[key]
	return ok
}

// Note returns a string-valued key.
func (r *Results) Note(key string) string { return r.notes[key] }

// Rows returns the table.
func (r *Results) Rows() []Row { return r.rows }

func (r *Results) addRow(row Row) { r.rows = append(r.rows, row) }

// MarshalJSON writes one object of named numbers (keys sorted), plus the
// string notes.
func (r *Results) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, len(r.values)+len(r.notes))
	for k, v := range r.values {
		if v == nil {
			m[k] = nil
		} else {
			m[k] = round(*v)
		}
	}
	for k, v := range r.notes {
		m[k] = v
	}
	return json.Marshal(m)
}

// WriteJSON writes the results, indented, to path.
func (r *Results) WriteJSON(path string) error {
	return r.writeJSON(path, nil)
}

// MergeJSON writes the results to path like WriteJSON, keeping the keys of
// the JSON object already there that this run did not write: make bench
// and make bench-scale each replace their own keys in bench/results.json.
func (r *Results) MergeJSON(path string) error {
	old := map[string]json.RawMessage{}
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &old); err != nil {
			return fmt.Errorf("%s: not one JSON object, not merged into: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return r.writeJSON(path, old)
}

func (r *Results) writeJSON(path string, base map[string]json.RawMessage) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if len(base) > 0 {
		var mine map[string]json.RawMessage
		if err := json.Unmarshal(b, &mine); err != nil {
			return err
		}
		for k, v := range mine {
			base[k] = v
		}
		if b, err = json.Marshal(base); err != nil {
			return err
		}
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, out.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// round keeps four significant digits, enough for noisy measurements and
// short enough to read.
func round(v float64) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	mag := math.Pow(10, 3-math.Floor(math.Log10(math.Abs(v))))
	if mag < 1 {
		return math.Round(v)
	}
	return math.Round(v*mag) / mag
}

// WriteTable prints the table with aligned columns, as Markdown.
func (r *Results) WriteTable(w io.Writer) error {
	head := Row{"name", "lockfs", "reference", "ratio", "goal", "met?"}
	rows := append([]Row{head}, r.rows...)
	width := make([]int, 6)
	for _, row := range rows {
		for i, c := range row.cells() {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for i, c := range cells {
			fmt.Fprintf(&b, " %s%s |", c, strings.Repeat(" ", width[i]-len([]rune(c))))
		}
		b.WriteString("\n")
	}
	line(head.cells())
	sep := make([]string, 6)
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	line(sep)
	for _, row := range r.rows {
		line(row.cells())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (row Row) cells() []string {
	return []string{row.Name, row.Lockfs, row.Reference, row.Ratio, row.Goal, row.Met}
}

// goal is a target for one key's value.
type goal struct {
	text string             // as shown: "≤ 1.15"
	ok   func(float64) bool // whether a value meets it
}

func atMost(x float64) goal {
	return goal{fmt.Sprintf("≤ %g", x), func(v float64) bool { return v <= x }}
}
func atLeast(x float64) goal {
	return goal{fmt.Sprintf("≥ %g", x), func(v float64) bool { return v >= x }}
}
func equal(x float64) goal {
	return goal{fmt.Sprintf("= %g", x), func(v float64) bool { return v == x }}
}
func between(a, b float64) goal {
	return goal{fmt.Sprintf("%g … %g", a, b), func(v float64) bool { return v >= a && v <= b }}
}

// met renders whether key's value meets g: "yes", "NO" or "n/a".
func (r *Results) met(key string, g *goal) (string, string) {
	if g == nil {
		return "", ""
	}
	v, ok := r.Value(key)
	switch {
	case !ok:
		return g.text, "n/a"
	case g.ok(v):
		return g.text, "yes"
	default:
		return g.text, "NO"
	}
}

// fmtNum renders a number with about three significant digits.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "–"
	case v == math.Trunc(v) && a < 1e15:
		return fmt.Sprintf("%.0f", v) // counts
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

// fmtSummary renders "median [min–max] unit", or just the value when the
// series has one repetition.
func fmtSummary(s summary, unit string) string {
	if unit != "" {
		unit = " " + unit
	}
	if s.Min == s.Max {
		return fmtNum(s.Med) + unit
	}
	return fmt.Sprintf("%s [%s–%s]%s", fmtNum(s.Med), fmtNum(s.Min), fmtNum(s.Max), unit)
}

// RequiredKeys are the keys every run writes (issue 5): a number each, or
// null for the GCS keys when gcs_unavailable_reason says why (the etcd keys
// when etcd_unavailable_reason does).
var RequiredKeys = []string{
	"lock_pair_us", "noop_fuse_lock_pair_us", "kernel_lock_pair_us", "lock_pair_ratio_vs_noop",
	"handoff_p99_us", "poll_handoff_p99_us", "handoff_ratio_vs_poll",
	"seq_read_ratio_vs_backing", "seq_write_ratio_vs_backing",
	"meta_ops_ratio_vs_gofuse", "meta_ops_ratio_vs_gofuse_default_permissions",
	"tree_walk_ratio_vs_gofuse", "rss_after_forget_mb",
	"etcd_handoff_cross_host_p99_ms", "etcd_acquire_ms_depth4", "etcd_requests_per_acquire_depth4",
	"etcd_requests_per_warm_reacquire",
	"gcs_writes_per_acquire", "gcs_writes_per_release", "gcs_requests_local_handoff",
	"gcs_refreshes_per_ttl", "gcs_takeover_s_minus_ttl", "gcs_takeover_s_after_kill_minus_ttl", "gcs_want_noticed_s",
	"gcs_writes_cold_acquire_release_depth4", "gcs_writes_per_warm_iteration_depth4",
	"gcs_writes_per_refresh_interval_1000_held", "gcs_acquire_ms_depth4_rtt30",
	"gcs_fleet_acquires_per_s", "gcs_fleet_lease_losses", "gcs_fleet_max_object_writes_per_s",
	"disjoint_1p_pairs_per_s", "disjoint_2p_pairs_per_s", "disjoint_4p_pairs_per_s", "disjoint_8p_pairs_per_s",
	"cycle_per_s",
	"fair_cross_mount_wait_ms", "kernel_fair_wait_ms",
	"drain_10k_waiters_s", "kernel_drain_waiters_s", "drain_10k_rss_mb",
}

// ScaleKeys are the keys make bench-scale writes (Config.Scale): a number
// each, or null with a reason.
var ScaleKeys = []string{
	"gcs_sim_1000_hosts_writes_per_s", "gcs_sim_1000_hosts_losses", "gcs_sim_1000_hosts_class_a_per_s",
	"gcs_usd_per_host_month_idle", "gcs_usd_per_host_month_churning",
	"etcd_sim_1000_hosts_requests_per_s", "etcd_sim_1000_hosts_losses",
	"held_100k_rss_mb", "acquire_ratio_100k_vs_100",
}
