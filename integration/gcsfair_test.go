package integration

// Fair turns between hosts and lock-delay on the gcs backend (SPEC §2.7,
// §4; issue 27): real daemons on one emulator bucket, driven by flock(1)
// and python3.

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/stamp"
	"golang.org/x/sys/unix"
)

// pausedOverlap runs the paused-daemon scenario once: A's holder works
// under `flock -x a/.lock` (stamping), B's holder waits on host B, A's
// daemon is SIGSTOPped for 1.5 × TTL and resumed. It returns how long A's
// holder ran on after B's holder entered (0 if not at all), and when B's
// holder entered after the stop (from the stamps' clock).
func pausedOverlap(t *testing.T, lockDelay string) (overlap, entered time.Duration) {
	t.Helper()
	require(t, "python3")
	_, a, b := twoHosts(t, gcsHost{id: "host-a", lockDelay: lockDelay}, gcsHost{id: "host-b"})
	stamps := filepath.Join(t.TempDir(), "stamps")
	ha := start(t, "flock", "-x", a.path("a/.lock"), "python3", "-c", stamp.Program, "A", stamps, "1000")
	ha.waitLine("held", 15*time.Second)
	time.Sleep(1200 * time.Millisecond) // across a heartbeat
	hb := start(t, "flock", "-x", b.path("a/.lock"), "python3", "-c", stamp.Program, "B", stamps, "0.5")
	if line, ok := hb.nextLine(500 * time.Millisecond); ok {
		t.Fatalf("B's holder printed %q while A's holds the lock", line)
	}
	stopped := monotonic()
	if err := syscall.Kill(a.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(a.Pid(), syscall.SIGCONT)
		}
	}
	defer resume()
	time.Sleep(gcsTTL * 3 / 2)
	resume()
	hb.waitLine("held", gcsTakeover+10*time.Second)
	if _, ok := hb.wait(10 * time.Second); !ok {
		t.Fatal("B's holder did not end")
	}
	if _, ok := ha.wait(10 * time.Second); !ok {
		t.Fatal("A's holder was not stopped (--on-lease-loss SIGTERM) within 10 s of its daemon's resumption")
	}
	iv, err := stamp.Spans(stamps)
	if err != nil {
		t.Fatal(err)
	}
	ia, ib := iv["A"], iv["B"]
	if ib == [2]float64{} {
		t.Fatalf("no stamp of B's holder: %v", iv)
	}
	if d := ia[1] - ib[0]; d > 0 {
		overlap = time.Duration(d * float64(time.Second))
	}
	return overlap, time.Duration((ib[0] - stopped) * float64(time.Second))
}

// monotonic reads CLOCK_MONOTONIC in seconds, as python3's time.monotonic.
func monotonic() float64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return float64(ts.Nano()) / 1e9
}

// TestGCSPausedDaemonLockDelay: host A's daemon is paused (SIGSTOP) for
// 1.5 × TTL while its holder works; host B's waiter is granted only after
// TTL + lock-delay, by which time A's daemon, resumed, has found its
// session gone and stopped its holder (SIGTERM): the two holders' stamps,
// from one monotonic clock, do not overlap. Control: with --lock-delay 0,
// B enters while A is still paused, and the holders overlap.
func TestGCSPausedDaemonLockDelay(t *testing.T) {
	var overlaps [2]time.Duration
	for i, tc := range []struct {
		name, delay string
	}{{"default", ""}, {"control-lock-delay-0", "0"}} {
		t.Run(tc.name, func(t *testing.T) {
			overlap, entered := pausedOverlap(t, tc.delay)
			overlaps[i] = overlap
			t.Logf("lock-delay %q: B's holder entered %v after A's daemon was stopped for %v; A's holder ran on %v beside it",
				tc.delay, entered.Round(time.Millisecond), gcsTTL*3/2, overlap.Round(time.Millisecond))
		})
	}
	if overlaps[0] != 0 {
		t.Errorf("with the default lock-delay, A's holder ran %v beside B's", overlaps[0])
	}
	if overlaps[1] == 0 {
		t.Errorf("control: with --lock-delay 0 the holders did not overlap, so this test could not see an overlap")
	}
}
