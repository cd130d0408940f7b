package integration

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// Fairness across daemons (SPEC §2.7, docs/PROTOCOL.md "Fairness across
// daemons"): mount A is under continuous demand for b/.lock (three loops of
// `flock -x b/.lock sleep 0.2`, so one of them always waits and A could
// hand the lock from one to the next for ever). A waiter outside A, on a
// second mount of the same SOURCE or a program that flocks SOURCE's
// backing file directly, gets the lock: A gives it up after the holds
// running then. The control is the same run with A's give-up turned off
// (LOCKFS_TEST_KEEP_CONTENDED=1): the waiter does not get it within its
// bound.

// keepContendedEnv turns a daemon's give-up off: the control.
const keepContendedEnv = "LOCKFS_TEST_KEEP_CONTENDED=1"

// busyLoops starts n loops taking path exclusively for hold each, one
// after the other, each in its own session; cleanup kills them.
func busyLoops(t *testing.T, path string, n int, hold time.Duration) {
	t.Helper()
	script := fmt.Sprintf(`while :; do flock -x "$1" sleep %.3f; done`, hold.Seconds())
	for range n {
		start(t, "sh", "-c", script, "sh", path)
	}
}

func TestTurnsAcrossMounts(t *testing.T) {
	require(t, "flock")
	const hold = 200 * time.Millisecond
	for _, c := range []struct {
		name    string
		direct  bool // the waiter flocks SOURCE's backing file
		control bool // A's give-up is off
	}{
		{name: "second mount"},
		{name: "direct SOURCE client", direct: true},
		{name: "control second mount", control: true},
		{name: "control direct SOURCE client", direct: true, control: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var env []string
			if c.control {
				env = append(env, keepContendedEnv)
			}
			a := mount(t, withEnv(env...))
			target := a.srcPath("b", "..LOCK")
			if !c.direct {
				target = mount(t, withSource(a.Src)).path("b", ".lock")
			}
			busyLoops(t, a.path("b", ".lock"), 3, hold)
			// Let the loops run a few holds: A always has a waiter now.
			time.Sleep(4 * hold)
			if r := flockN(t, a.path("b", ".lock")); r.code != 1 {
				t.Fatalf("flock -n on A's busy lock: %v, want it refused", r)
			}

			bound := 60 * time.Second
			if c.control {
				bound = 3 * time.Second
			}
			r := run(t, bound+30*time.Second, "flock", "-x", "-w", fmt.Sprint(bound.Seconds()), target, "true")
			switch {
			case c.control && r.code == 0:
				t.Fatalf("control: the waiter on %s got the lock in %v with A's give-up off", filepath.Base(target), r.took)
			case c.control:
				expectCode(t, "control: flock -w on the busy lock", r, 1)
			default:
				expectCode(t, "flock -x -w 60 while A is busy", r, 0)
				t.Logf("the waiter on %s waited %v", target, r.took)
			}
		})
	}
}
