package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDocumentedAlerts: every alert rule in docs/OPERATIONS.md is valid
// (promtool check rules) and can fire on the series a real daemon exports.
// The series come from a scrape of a fresh gcs mount, before any lock was
// taken: each alert's scenario raises one scraped series from its scraped
// value, and promtool test rules must see that alert fire and no other.
// A counter missing from the fresh scrape fails the test (increase() would
// miss the first event), and so does a wait histogram whose buckets stop at
// the alert's threshold (histogram_quantile cannot exceed the last finite
// bucket). An alert in the docs without a scenario here fails too.
func TestDocumentedAlerts(t *testing.T) {
	require(t, "promtool")
	rules := alertRules(t)
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yml")
	if err := os.WriteFile(rulesFile, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(t, 30*time.Second, "promtool", "check", "rules", rulesFile); r.code != 0 {
		t.Fatalf("promtool check rules on the documented alerts: %v", r)
	}
	names := regexp.MustCompile(`(?m)^\s*- alert: (\S+)`).FindAllStringSubmatch(rules, -1)
	if len(names) == 0 {
		t.Fatal("no alert rules found in docs/OPERATIONS.md")
	}

	emu := startEmulator(t)
	addr := freePort(t)
	m := mount(t, withArgs("--backend", "gcs", "--gcs-bucket", emu.Bucket, "--gcs-endpoint", emu.Endpoint(),
		"--lease-ttl", gcsTTL.String(), "--host-id", "alerts", "--metrics-addr", addr))
	scraped := scrapeSeries(t, "http://"+addr+"/metrics", "lockfs_")
	m.stop(20 * time.Second)

	const instance = `instance="lockfs-test:9469",job="lockfs"`
	// A scenario makes one alert fire: it says which scraped series rise
	// and how, as promtool values after 10 minutes at the scraped value.
	type rise struct {
		match  func(name string, labels map[string]string) bool
		values func(start float64) string
	}
	counterStep := func(name string, want map[string]string) rise {
		return rise{
			match:  func(n string, l map[string]string) bool { return n == name && hasLabels(l, want) },
			values: func(v float64) string { return fmt.Sprintf("%gx10 %gx10", v, v+1) },
		}
	}
	scenarios := map[string]struct {
		rise   rise
		labels func(series map[string]string) map[string]string // the alert's labels
	}{
		"LockfsLeaseLost": {rise: counterStep("lockfs_holds_lost_total", map[string]string{"cause": "lease", "kind": "dir"})},
		"LockfsDeadlocks": {rise: counterStep("lockfs_lock_requests_total",
			map[string]string{"outcome": "deadlock", "kind": "dir", "mode": "exclusive"})},
		"LockfsGCSThrottled": {rise: rise{
			match: func(n string, l map[string]string) bool {
				return n == "lockfs_backend_requests_total" && l["outcome"] == "rate_limited"
			},
			values: func(v float64) string { return fmt.Sprintf("%gx10 %g+600x10", v, v+600) }, // 10/s
		}},
		// One granted wait of 400 s: every bucket from 400 s up counts it.
		"LockfsLongWaits": {
			rise: rise{
				match: func(n string, l map[string]string) bool {
					if n != "lockfs_lock_wait_seconds_bucket" || !hasLabels(l, map[string]string{"outcome": "granted", "kind": "dir", "mode": "exclusive"}) {
						return false
					}
					le, err := strconv.ParseFloat(l["le"], 64)
					return err == nil && le >= 400
				},
				values: func(v float64) string { return fmt.Sprintf("%gx10 %gx10", v, v+1) },
			},
			labels: func(map[string]string) map[string]string { return map[string]string{} }, // sum by (le), then no labels
		},
	}

	var tests strings.Builder
	fmt.Fprintf(&tests, "rule_files: [%s]\nevaluation_interval: 1m\ntests:\n", rulesFile)
	for _, n := range names {
		alert := n[1]
		sc, ok := scenarios[alert]
		if !ok {
			t.Errorf("docs/OPERATIONS.md has alert %s, which this test has no scenario for", alert)
			continue
		}
		fmt.Fprintf(&tests, "- interval: 1m\n  name: %s\n  input_series:\n", alert)
		var risen []map[string]string
		for _, s := range scraped {
			values := fmt.Sprintf("%gx20", s.value)
			if sc.rise.match(s.name, s.labels) {
				values = sc.rise.values(s.value)
				risen = append(risen, s.labels)
			}
			fmt.Fprintf(&tests, "  - series: '%s'\n    values: '%s'\n", withLabels(s.text, instance), values)
		}
		if len(risen) == 0 {
			t.Errorf("%s: a fresh daemon exports no series its expression reads: it could not fire on the first event", alert)
			continue
		}
		fmt.Fprintf(&tests, "  alert_rule_test:\n")
		for _, other := range names {
			fmt.Fprintf(&tests, "  - eval_time: 13m\n    alertname: %s\n", other[1])
			if other[1] != alert {
				fmt.Fprintf(&tests, "    exp_alerts: []\n")
				continue
			}
			fmt.Fprintf(&tests, "    exp_alerts:\n")
			var sets []map[string]string
			if sc.labels != nil {
				sets = []map[string]string{sc.labels(nil)}
			} else {
				sets = risen
			}
			for _, l := range sets {
				fmt.Fprintf(&tests, "    - exp_labels: {%s}\n      exp_annotations: {summary: %q}\n",
					yamlLabels(l, ruleLabels(rules, alert), len(l) > 0), summary(rules, alert))
			}
		}
	}
	if t.Failed() {
		return
	}
	testFile := filepath.Join(dir, "tests.yml")
	if err := os.WriteFile(testFile, []byte(tests.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(t, 60*time.Second, "promtool", "test", "rules", testFile); r.code != 0 {
		t.Fatalf("promtool test rules: %v\n(tests in %s)", r, tests.String()[:min(4000, tests.Len())])
	}
}

// alertRules returns the YAML block that follows "Example alert rules" in
// docs/OPERATIONS.md.
func alertRules(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "Example alert rules")
	if !ok {
		t.Fatal(`docs/OPERATIONS.md has no "Example alert rules"`)
	}
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	body, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/OPERATIONS.md: no ```yaml block after the example alert rules")
	}
	return body
}

// series is one sample of a scrape.
type series struct {
	text   string // name{labels} as exposed
	name   string
	labels map[string]string
	value  float64
}

var labelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// metricsClient closes each scrape's connection, so that a daemon does
// not keep one open for the test between scrapes (TestDaemonResources...
// counts the daemon's sockets).
var metricsClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

// scrapeSeries reads the samples of a metrics endpoint whose names start
// with prefix.
func scrapeSeries(t *testing.T, url, prefix string) []series {
	t.Helper()
	resp, err := metricsClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out []series
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") || !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape line %q: %v", line, err)
		}
		s := series{text: line[:i], name: line[:i], labels: map[string]string{}, value: v}
		if j := strings.IndexByte(s.text, '{'); j >= 0 {
			s.name = s.text[:j]
			for _, m := range labelRE.FindAllStringSubmatch(s.text[j:], -1) {
				s.labels[m[1]] = m[2]
			}
		}
		out = append(out, s)
	}
	return out
}

// withLabels adds labels to an exposed series name.
func withLabels(text, extra string) string {
	if strings.HasSuffix(text, "}") {
		return strings.TrimSuffix(text, "}") + "," + extra + "}"
	}
	return text + "{" + extra + "}"
}

func hasLabels(l, want map[string]string) bool {
	for k, v := range want {
		if l[k] != v {
			return false
		}
	}
	return true
}

// ruleLabels returns the labels: {k: v, ...} line of alert's rule.
func ruleLabels(rules, alert string) map[string]string {
	out := map[string]string{}
	block := ruleBlock(rules, alert)
	if m := regexp.MustCompile(`labels: \{([^}]*)\}`).FindStringSubmatch(block); m != nil {
		for _, kv := range strings.Split(m[1], ",") {
			k, v, _ := strings.Cut(kv, ":")
			out[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return out
}

// summary returns alert's summary annotation with {{ $labels.instance }}
// expanded as Prometheus would for the test series.
func summary(rules, alert string) string {
	m := regexp.MustCompile(`summary: "([^"]*)"`).FindStringSubmatch(ruleBlock(rules, alert))
	if m == nil {
		return ""
	}
	return strings.ReplaceAll(m[1], "{{ $labels.instance }}", "lockfs-test:9469")
}

func ruleBlock(rules, alert string) string {
	_, rest, _ := strings.Cut(rules, "- alert: "+alert+"\n")
	block, _, _ := strings.Cut(rest, "- alert: ")
	return block
}

// yamlLabels renders an alert's expected labels: the series' labels (with
// the scrape target's instance and job, when the expression keeps them)
// and the rule's own.
func yamlLabels(series, rule map[string]string, keepTarget bool) string {
	all := map[string]string{}
	for k, v := range series {
		all[k] = v
	}
	if keepTarget {
		all["instance"], all["job"] = "lockfs-test:9469", "lockfs"
	}
	for k, v := range rule {
		all[k] = v
	}
	keys := make([]string, 0, len(all))
	for k := range all {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %q", k, all[k])
	}
	return strings.Join(parts, ", ")
}
