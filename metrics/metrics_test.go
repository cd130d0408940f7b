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
	held := []lockmgr.LockStatus{{
		Lock:    lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir},
		Holders: []lockmgr.Holder{{Mode: lockmgr.Exclusive, Explicit: true}},
		Waiters: []lockmgr.Waiter{{Mode: lockmgr.Shared}},
	}}
	m := New(func() []lockmgr.LockStatus { return held })
	id := lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}
	m.Requested(lockmgr.Request{Lock: id, Mode: lockmgr.Exclusive}, lockmgr.Grant{Token: 1}, lockmgr.Granted, 3*time.Millisecond)
	m.Requested(lockmgr.Request{Lock: id, Mode: lockmgr.Shared}, lockmgr.Grant{}, lockmgr.Conflict, time.Microsecond)
	m.Requested(lockmgr.Request{Lock: id, Mode: lockmgr.Shared}, lockmgr.Grant{}, lockmgr.Deadlock, time.Microsecond)
	m.Lost(id, true)
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
