package fs

import (
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestStatusShowsOutsideWaiters: a request blocked by a holder outside
// this daemon (a program locking SOURCE directly, or a second daemon over
// the same SOURCE) is shown in the status, with who blocks it. Before the
// fix the status said "waiters 0" while it waited.
func TestStatusShowsOutsideWaiters(t *testing.T) {
	m := newCtlMount(t)
	m2 := newCtlMountAt(t, m.src, nil)
	m.mkdir("a")
	for _, c := range []struct{ who, holder string }{
		{"a direct client of SOURCE/a/..LOCK", m.src + "/a/..LOCK"},
		{"a second daemon", m2.path("a/.lock")},
	} {
		h := flockHold(t, c.holder, "-x")
		waiter := startPy(t, 0, 0)
		waiter.must("ok", "open f %s", m.path("a/.lock"))
		waiter.send("flock f ex")
		want := fmt.Sprintf("waiter pid=%d uid=0 mode=exclusive since=", waiter.pid)
		testutil.Eventually(t, "the waiter blocked by "+c.who+" to show in status", func() bool {
			st := m.status("a/.lock")
			return strings.Contains(st, "\nwaiters 1\n") && strings.Contains(st, want)
		})
		st := m.status("a/.lock")
		if !strings.Contains(st, ` outside blocker="another process or daemon on this host (backing file)"`) {
			t.Errorf("blocked by %s: status does not say who blocks:\n%s", c.who, st)
		}
		// Control: the waiter really waits, and gets the lock once the
		// outside holder is gone; then nobody waits.
		if r := waiter.reply(0); r != "" {
			t.Fatalf("waiter answered %q while %s holds the lock", r, c.who)
		}
		syscall.Kill(-h, syscall.SIGKILL)
		if r := waiter.reply(testutil.DefaultWait); r != "ok" {
			t.Fatalf("waiter after %s let go: %q", c.who, r)
		}
		if st := m.status("a/.lock"); !strings.Contains(st, "\nwaiters 0\n") || strings.Contains(st, "\nwaiter ") {
			t.Errorf("after the grant, status still shows a waiter:\n%s", st)
		}
		waiter.kill()
		testutil.Eventually(t, "a to be free", func() bool { return flockNB(t, "-x", m.src+"/a/..LOCK") })
	}
}
