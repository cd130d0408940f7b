package control_test

import (
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/fs/control"
	"github.com/lockfs/lockfs/fs/internal/fstest"
	"github.com/lockfs/lockfs/internal/testutil"
)

// TestQueuedLockWaitsHoldNoGoroutine: 24 flock(1) waits queued behind a
// holder are parked in the engine (LockWaitDeferred), no goroutine asleep
// for each; more whose flock -w runs out get EINTR (exit 1) and leave the
// queue; the engine's close answers the rest (ENOLCK, exit 71), and no
// goroutine outlives the mount (fstest.CheckGoroutinesOnce).
// Control: with parkLockWaits off, the old path, one goroutine per wait.
func TestQueuedLockWaitsHoldNoGoroutine(t *testing.T) {
	const n = 24
	for _, mode := range []string{"parked", "control-goroutines"} {
		t.Run(mode, func(t *testing.T) {
			if mode != "parked" {
				defer control.SetParkLockWaits(false)()
			}
			m := newCtlMount(t)
			m.Mkdir("a")
			f := m.Path("a/.lock")
			fstest.FlockHold(t, f, "-x")
			start := func(args ...string) *exec.Cmd {
				c := exec.Command("flock", append(args, f, "true")...)
				c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
				if err := c.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Process.Kill(); c.Wait() })
				return c
			}
			waiters := func() string {
				for _, l := range strings.Split(m.Status("a/.lock"), "\n") {
					if strings.HasPrefix(l, "waiters ") {
						return l
					}
				}
				return ""
			}
			var queued []*exec.Cmd
			for i := 0; i < n; i++ {
				queued = append(queued, start("-x"))
			}
			want := "waiters " + strconv.Itoa(n)
			testutil.Eventually(t, "the waits to queue", func() bool { return waiters() == want })
			asleep := sleepingInEngine()
			t.Logf("%s: %d goroutines asleep in the engine with %d waits queued", mode, asleep, n)
			switch {
			case mode == "parked" && asleep != 0:
				t.Errorf("%d goroutines asleep in the engine with %d flock waits parked, want none", asleep, n)
			case mode != "parked" && asleep != n:
				t.Errorf("control: %d goroutines asleep in the engine with %d waits on goroutines, want %d: the test cannot tell", asleep, n, n)
			}

			// Waits that time out (SIGALRM: an interrupt) answer EINTR
			// and leave the queue.
			var timed []*exec.Cmd
			for i := 0; i < n/3; i++ {
				timed = append(timed, start("-x", "-w", "5"))
			}
			if !testutil.Poll(5*time.Second, func() bool { return waiters() == "waiters "+strconv.Itoa(n+n/3) }) {
				t.Logf("not all the flock -w waits were seen queued (%s)", waiters())
			}
			for _, c := range timed {
				if err := c.Wait(); exitStatus(err) != 1 {
					t.Errorf("flock -w 5 on a held lock ended with %v, want exit status 1 (timed out: EINTR)", err)
				}
			}
			testutil.Eventually(t, "the timed-out waits to leave the queue", func() bool { return waiters() == want })

			// The daemon stops with waits queued: each is answered.
			if err := m.Engine.Close(); err != nil {
				t.Fatal(err)
			}
			for _, c := range queued {
				if err := c.Wait(); exitStatus(err) != 71 {
					t.Errorf("a flock queued when the engine closed ended with %v, want exit status 71 (ENOLCK)", err)
				}
			}
		})
	}
}

// sleepingInEngine counts the goroutines asleep in a lock wait of the
// engine. (Each waiting process also has an exit watch, lockmgr
// procwatch.go, for its implicit holds: not counted.)
func sleepingInEngine() int {
	return strings.Count(testutil.AllStacks(), "lockmgr.(*Engine).sleepDropsMu(")
}

// exitStatus is a finished command's exit status: 0 for nil, -1 if it
// did not exit.
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}
