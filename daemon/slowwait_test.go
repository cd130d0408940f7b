package daemon

import (
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/lockmgr"
)

// TestWaitWatch: a wait is logged once it passes the threshold, again
// every waitRepeat while it lasts, never before the threshold, with the
// lock it asked for and the conflicting holder named (pid, command, host).
func TestWaitWatch(t *testing.T) {
	log, hook := logtest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	t0 := time.Unix(10000, 0)
	a := lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}
	ab := lockmgr.LockID{Path: "a/b", Kind: lockmgr.KindDir}
	snap := []lockmgr.LockStatus{{
		Lock: a,
		Holders: []lockmgr.Holder{{Owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 1}, Mode: lockmgr.Exclusive, Explicit: true,
			Process: lockmgr.ProcID{PID: 10}, Host: "h1"}},
		Waiters: []lockmgr.Waiter{{Owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 2}, Mode: lockmgr.Shared, Implicit: true,
			Process: lockmgr.ProcID{PID: 20}, TID: 20, Since: t0, Wants: ab, WantsMode: lockmgr.Exclusive}},
	}}
	w := newWaitWatch(func() []lockmgr.LockStatus { return snap }, time.Second, log)
	w.describe = func(pid int) procinfo.Command {
		if pid == 10 {
			return procinfo.Command{PID: 10, Name: "flock", Line: "flock a/.lock make", Runs: &procinfo.Command{PID: 11, Name: "make", Line: "make deploy"}}
		}
		return procinfo.Command{PID: pid, Name: "flock", Line: "flock a/b/.lock true"}
	}
	lines := func() int { return len(hook.AllEntries()) }

	w.scan(snap, t0.Add(500*time.Millisecond)) // the control: not yet over the threshold
	if n := lines(); n != 0 {
		t.Fatalf("%d lines for a wait under the threshold", n)
	}
	w.scan(snap, t0.Add(2*time.Second))
	if n := lines(); n != 1 {
		t.Fatalf("%d lines after the wait passed the threshold, want 1", n)
	}
	e := hook.LastEntry()
	if e.Level != logrus.InfoLevel || e.Data["path"] != "a/b/.lock" || e.Data["mode"] != "exclusive" ||
		e.Data["waiting_on"] != "a/.lock" || e.Data["pid"] != 20 {
		t.Errorf("line: %v %v", e.Level, e.Data)
	}
	if b, _ := e.Data["blocked_by"].(string); !strings.Contains(b, "pid=10 host=h1 exclusive make deploy [11 under flock]") {
		t.Errorf("blocked_by %q", b)
	}
	w.scan(snap, t0.Add(30*time.Second))
	if n := lines(); n != 1 {
		t.Fatalf("logged again within a minute: %d lines", n)
	}
	w.scan(snap, t0.Add(63*time.Second))
	if n := lines(); n != 2 {
		t.Fatalf("%d lines a minute later, want 2", n)
	}
	// Granted: forgotten; a new wait of the same waiter is a new one.
	w.scan(nil, t0.Add(64*time.Second))
	if len(w.logged) != 0 {
		t.Fatalf("finished waits still tracked: %v", w.logged)
	}
	// No conflicting holder, one waiter ahead: it says so.
	snap[0].Holders = nil
	snap[0].Waiters = append([]lockmgr.Waiter{{Owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 3}, Mode: lockmgr.Exclusive,
		Process: lockmgr.ProcID{PID: 30}, Since: t0.Add(time.Hour)}}, snap[0].Waiters...)
	w.scan(snap, t0.Add(70*time.Second))
	if b, _ := hook.LastEntry().Data["blocked_by"].(string); !strings.Contains(b, "1 earlier waiters queued ahead") {
		t.Errorf("blocked_by without holders: %q", b)
	}
}

// TestWaitWatchManyWaiters: of 100 long waits on one lock, a scan logs
// maxWaitLines one by one and the other 90 in one line, and none again
// within a minute. (With the cap removed: 100 lines.)
func TestWaitWatchManyWaiters(t *testing.T) {
	log, hook := logtest.NewNullLogger()
	t0 := time.Unix(10000, 0)
	st := lockmgr.LockStatus{Lock: lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}}
	for i := range 100 {
		st.Waiters = append(st.Waiters, lockmgr.Waiter{Owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: uint64(i + 1)},
			Mode: lockmgr.Exclusive, Process: lockmgr.ProcID{PID: 100 + i}, TID: 100 + i, Since: t0.Add(time.Duration(i) * time.Millisecond)})
	}
	snap := []lockmgr.LockStatus{st}
	w := newWaitWatch(func() []lockmgr.LockStatus { return snap }, time.Second, log)
	described := 0
	w.describe = func(pid int) procinfo.Command { described++; return procinfo.Command{PID: pid, Name: "flock"} }
	w.scan(snap, t0.Add(5*time.Second))
	entries := hook.AllEntries()
	if len(entries) != maxWaitLines+1 {
		t.Fatalf("%d lines for 100 long waits, want %d and one summary", len(entries), maxWaitLines)
	}
	last := entries[len(entries)-1]
	if last.Message != "lock waits are long: more still waiting" || last.Data["waiters"] != 100-maxWaitLines ||
		last.Data["waiting_on"] != "a/.lock" || last.Data["longest"] != "5s" {
		t.Errorf("summary: %q %v", last.Message, last.Data)
	}
	if described > maxWaitLines {
		t.Errorf("%d commands read for %d lines", described, maxWaitLines)
	}
	w.scan(snap, t0.Add(30*time.Second))
	if n := len(hook.AllEntries()); n != maxWaitLines+1 {
		t.Errorf("%d lines after a second scan within the minute, want none more", n-maxWaitLines-1)
	}
}
