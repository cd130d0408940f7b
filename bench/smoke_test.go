package bench_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/bench"
	"github.com/lockfs/lockfs/internal/testutil"
)

func TestMain(m *testing.M) {
	bench.HelperMain() // Run re-executes this binary as a GCS holder host
	os.Exit(m.Run())
}

// requireFUSE fails (under CI=true) or skips the test if FUSE cannot be used.
func requireFUSE(t *testing.T) {
	t.Helper()
	var missing []string
	if _, err := exec.LookPath("fusermount3"); err != nil {
		missing = append(missing, "fusermount3 (apt-get install -y fuse3)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		missing = append(missing, "/dev/fuse")
	}
	if len(missing) == 0 {
		return
	}
	testutil.Missing(t, "missing %s", strings.Join(missing, ", "))
}

// TestSmoke runs every measurement of the harness at tiny sizes, once, and
// checks that results.json has every required key with a number. It checks
// no time: on a shared machine the figures of a run this small mean
// nothing.
func TestSmoke(t *testing.T) {
	requireFUSE(t)
	work := t.TempDir()
	t.Cleanup(func() { detachUnder(t, work) }) // whatever happened
	cfg := bench.SmokeConfig()
	cfg.WorkDir = work
	cfg.Log = testWriter{t}
	// A bound against a hang, not a performance assertion: on a loaded
	// 2-core machine building the helpers alone took 2 minutes, and the
	// GCS steps wait out several TTLs (SmokeConfig).
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(work, "results.json")
	if err := res.WriteJSON(out); err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("table:\n%s", table.String())

	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("results.json is not one JSON object: %v", err)
	}
	reason, _ := got["gcs_unavailable_reason"].(string)
	if reason != "" {
		if testutil.InCI() {
			t.Errorf("GCS figures unavailable: %s", reason)
		} else {
			t.Logf("GCS figures unavailable (set CI=true to fail): %s", reason)
		}
	}
	etcdReason, _ := got["etcd_unavailable_reason"].(string)
	if etcdReason != "" {
		if testutil.InCI() {
			t.Errorf("etcd figures unavailable: %s", etcdReason)
		} else {
			t.Logf("etcd figures unavailable (set CI=true to fail): %s", etcdReason)
		}
	}
	for _, k := range append(bench.RequiredKeys, bench.ScaleKeys...) {
		v, ok := got[k]
		switch {
		case !ok:
			t.Errorf("results.json has no %q", k)
		case v == nil && strings.HasPrefix(k, "gcs_") && reason != "":
		case v == nil && strings.HasPrefix(k, "etcd_") && etcdReason != "":
		case v == nil:
			t.Errorf("results.json: %q is null", k)
		default:
			if _, isNum := v.(float64); !isNum {
				t.Errorf("results.json: %q = %v, not a number", k, v)
			}
		}
	}
	for k, v := range got {
		if _, isNum := v.(float64); !isNum && v != nil && !strings.HasSuffix(k, "_reason") {
			t.Errorf("results.json: %q = %v, not a number", k, v)
		}
	}
	if n := len(res.Rows()); n < 10 {
		t.Errorf("the table has %d rows, want a row per measurement", n)
	}
	if mounts := mountsUnder(work); len(mounts) > 0 {
		t.Errorf("Run left mounts behind: %v", mounts)
	}
}

// mountsUnder lists the mount points under dir.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// detachUnder runs fusermount3 -uz on every mount under dir.
func detachUnder(t *testing.T, dir string) {
	for _, m := range mountsUnder(dir) {
		if out, err := exec.Command("fusermount3", "-uz", m).CombinedOutput(); err != nil {
			t.Logf("fusermount3 -uz %s: %v: %s", m, err, out)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { recover() }() // a line after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
