package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
)

// TestExposition: the counters move and the exposition names them.
func TestExposition(t *testing.T) {
	held := lockmgr.Tally{
		Held:    map[lockmgr.KindMode]int{{Kind: lockmgr.KindDir, Mode: lockmgr.Exclusive}: 1},
		Waiting: map[lockmgr.Kind]int{lockmgr.KindDir: 1},
	}
	m := New(func() lockmgr.Tally { return held })
	id := lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}
	m.Requested(lockmgr.Request{Lock: id, Mode: lockmgr.Exclusive}, lockmgr.Grant{Token: 1}, lockmgr.Granted, 3*time.Millisecond)
	m.Requested(lockmgr.Request{Lock: id, Mode: lockmgr.Shared}, lockmgr.Grant{}, lockmgr.Conflict, time.Microsecond)
	m.Requested(lockmgr.Request{Lock: id, Mode: lockmgr.Shared}, lockmgr.Grant{}, lockmgr.Deadlock, time.Microsecond)
	m.Lost(id, true)
	m.Yielded(id)
	m.FUSEOp("lookup", 50*time.Microsecond)

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`lockfs_lock_requests_total{kind="dir",mode="exclusive",outcome="granted"} 1`,
		`lockfs_lock_requests_total{kind="dir",mode="shared",outcome="conflict"} 1`,
		`lockfs_lock_requests_total{kind="dir",mode="shared",outcome="deadlock"} 1`,
		`lockfs_lock_wait_seconds_count{kind="dir",mode="exclusive",outcome="granted"} 1`,
		`lockfs_holds_lost_total{cause="break",kind="dir"} 1`,
		`lockfs_lock_yields_total{kind="dir"} 1`,
		`lockfs_locks_held{kind="dir",mode="exclusive"} 1`,
		`lockfs_locks_held{kind="dir",mode="shared"} 0`,
		`lockfs_lock_waiters{kind="dir"} 1`,
		`lockfs_fuse_op_seconds_count{op="lookup"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("exposition lacks %s", want)
		}
	}
	// The control: a counter that did not move is not reported as moved.
	if strings.Contains(text, `outcome="interrupted"} 1`) {
		t.Error("an interrupted request was counted that never happened")
	}
}

// scrape returns m's exposition text.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// TestCountersStartAtZero: before any event every counter's label sets are
// exported at 0 (so increase() > 0 sees the first event), the build is
// named, and the wait histogram reaches an hour.
func TestCountersStartAtZero(t *testing.T) {
	m := New(func() lockmgr.Tally { return lockmgr.Tally{} })
	m.RegisterBuildInfo("v1.2.3", "local")
	m.RegisterBackendRequests(func() []Count { return []Count{{Op: "lease", Outcome: "lost"}} })
	text := scrape(t, m)
	for _, want := range []string{
		`lockfs_holds_lost_total{cause="lease",kind="dir"} 0`,
		`lockfs_holds_lost_total{cause="break",kind="usage"} 0`,
		`lockfs_lock_yields_total{kind="newdir"} 0`,
		`lockfs_lock_requests_total{kind="dir",mode="exclusive",outcome="deadlock"} 0`,
		`lockfs_lock_requests_total{kind="newdir",mode="shared",outcome="denied"} 0`,
		`lockfs_lock_requests_total{kind="usage",mode="shared",outcome="failed"} 0`,
		`lockfs_backend_requests_total{op="lease",outcome="lost"} 0`,
		`lockfs_build_info{backend="local",go_version="go`,
		`lockfs_locks_held{kind="dir",mode="exclusive"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("a fresh exposition lacks %s", want)
		}
	}
	if WaitBuckets[len(WaitBuckets)-1] < 3600 {
		t.Errorf("wait buckets end at %v s, want an hour", WaitBuckets[len(WaitBuckets)-1])
	}
	// The control: the test reads what New exports, not a fixed text.
	if strings.Contains(text, `outcome="denied"} 1`) {
		t.Error("a denied request was counted that never happened")
	}
	m.Requested(lockmgr.Request{Lock: lockmgr.LockID{Path: "a", Kind: lockmgr.KindUsage}, Mode: lockmgr.Shared},
		lockmgr.Grant{}, lockmgr.Failed, 0)
	if !strings.Contains(scrape(t, m), `lockfs_lock_requests_total{kind="usage",mode="shared",outcome="failed"} 1`) {
		t.Error("a refused shared usage request was not counted")
	}
}
