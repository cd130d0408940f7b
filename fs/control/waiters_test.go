package control_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/lockfs/lockfs/fs/internal/fstest"
	"github.com/lockfs/lockfs/internal/testutil"
)

// TestStatusShowsOutsideWaiters: a request blocked by a holder outside
// this daemon (a program locking SOURCE directly, or a second daemon over
// the same SOURCE) is shown in the status, with who blocks it. Before the
// fix the status said "waiters 0" while it waited.
func TestStatusShowsOutsideWaiters(t *testing.T) {
	m := newCtlMount(t)
	m2 := newCtlMountAt(t, m.Src)
	m.Mkdir("a")
	for _, c := range []struct{ who, holder string }{
		{"a direct client of SOURCE/a/..LOCK", m.Src + "/a/..LOCK"},
		{"a second daemon", m2.Path("a/.lock")},
	} {
		h := fstest.FlockHold(t, c.holder, "-x")
		waiter := fstest.StartPy(t, 0, 0)
		waiter.Must("ok", "open f %s", m.Path("a/.lock"))
		waiter.Send("flock f ex")
		want := fmt.Sprintf("waiter pid=%d uid=0 mode=exclusive since=", waiter.PID)
		testutil.Eventually(t, "the waiter blocked by "+c.who+" to show in status", func() bool {
			st := m.Status("a/.lock")
			return strings.Contains(st, "\nwaiters 1\n") && strings.Contains(st, want)
		})
		st := m.Status("a/.lock")
		if !strings.Contains(st, ` outside blocker="another process or daemon on this host (backing file)"`) {
			t.Errorf("blocked by %s: status does not say who blocks:\n%s", c.who, st)
		}
		// Control: the waiter really waits, and gets the lock once the
		// outside holder is gone; then nobody waits.
		if r := waiter.Reply(0); r != "" {
			t.Fatalf("waiter answered %q while %s holds the lock", r, c.who)
		}
		syscall.Kill(-h, syscall.SIGKILL)
		if r := waiter.Reply(testutil.DefaultWait); r != "ok" {
			t.Fatalf("waiter after %s let go: %q", c.who, r)
		}
		if st := m.Status("a/.lock"); !strings.Contains(st, "\nwaiters 0\n") || strings.Contains(st, "\nwaiter ") {
			t.Errorf("after the grant, status still shows a waiter:\n%s", st)
		}
		waiter.Kill()
		testutil.Eventually(t, "a to be free", func() bool { return fstest.FlockNB(t, "-x", m.Src+"/a/..LOCK") })
	}
}
