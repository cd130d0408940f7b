package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// nHosts starts a namespace of backend and mounts n hosts in it, named
// host-a, host-b...
func nHosts(t *testing.T, backend string, n int, mod func(h *gcsHost)) []*Mount {
	t.Helper()
	ns := startNamespace(t, backend)
	var ms []*Mount
	for i := 0; i < n; i++ {
		h := gcsHost{id: "host-" + string(rune('a'+i))}
		if mod != nil {
			mod(&h)
		}
		ms = append(ms, mountIn(t, ns, h))
	}
	return ms
}

// busy starts n loops of `flock -x LOCK sh -c 'echo x >> COUNT; sleep
// 0.2'` in their own session: continuous demand for LOCK on its host,
// each grant counted as a line of COUNT. Cleanup kills them.
func busy(t *testing.T, lock, count string, n int) *proc {
	t.Helper()
	script := fmt.Sprintf(`for i in $(seq %d); do (while :; do flock -x %q sh -c 'echo x >> %q; sleep 0.2'; done) & done; wait`, n, lock, count)
	return start(t, "sh", "-c", script)
}

// waitOnce runs `flock -x -w BOUND LOCK true` and returns how long it took
// and whether it got the lock.
func waitOnce(t *testing.T, lock string, bound time.Duration) (time.Duration, bool) {
	t.Helper()
	began := time.Now()
	r := run(t, bound+30*time.Second, "flock", "-x", "-w", strconv.Itoa(int(bound/time.Second)), lock, "true")
	return time.Since(began), !r.timedOut && r.code == 0
}

// lines counts the lines of a file (0 if it does not exist).
func lines(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// TestGCSFairTurns: a host under continuous demand for a lock (three
// loops of `flock -x c/.lock sleep 0.2`) gives it up to a waiter on
// another host: on 2 hosts, B's `flock -w` gets it; on 4 hosts, the
// waiters of B, C and D all get it. The same holds for a directory: with
// A's loops on a/b/.lock, B's waiter for a/.lock gets it. With four hosts
// all under continuous demand, every host gets grants; each host's share
// is logged. Control: with the engine's give-up off
// (LOCKFS_TEST_KEEP_CONTENDED on A's daemon), B's waiter does not get the
// lock within its bound (nor the directory's).
func TestGCSFairTurns(t *testing.T)  { fairTurns(t, "gcs") }
func TestEtcdFairTurns(t *testing.T) { fairTurns(t, "etcd") }

func fairTurns(t *testing.T, backend string) {
	const bound = 30 * time.Second
	// twoHosts: A's loops take used, B waits once for wanted.
	twoHosts := func(t *testing.T, keep bool, used, wanted string) (time.Duration, bool) {
		ms := nHosts(t, backend, 2, func(h *gcsHost) {
			if keep && h.id == "host-a" {
				h.env = []string{"LOCKFS_TEST_KEEP_CONTENDED=1"}
			}
		})
		busy(t, ms[0].path(used), os.DevNull, 3)
		time.Sleep(2 * time.Second) // A's lease is in use
		b := bound
		if keep {
			b = 10 * time.Second
		}
		return waitOnce(t, ms[1].path(wanted), b)
	}
	for _, tc := range []struct{ name, used, wanted string }{
		{"", "c/.lock", "c/.lock"},
		{"-dir", "a/b/.lock", "a/.lock"},
	} {
		t.Run("2-hosts"+tc.name, func(t *testing.T) {
			d, ok := twoHosts(t, false, tc.used, tc.wanted)
			if !ok {
				t.Fatalf("B's waiter for %s did not get it within %v while A used %s continuously", tc.wanted, bound, tc.used)
			}
			t.Logf("B's waiter got the lock after %v", d.Round(time.Millisecond))
		})
		t.Run("control-give-up-off"+tc.name, func(t *testing.T) {
			if d, ok := twoHosts(t, true, tc.used, tc.wanted); ok {
				t.Errorf("control: with A's give-up off, B's waiter got the lock after %v: this test could not tell", d.Round(time.Millisecond))
			}
		})
	}
	t.Run("4-hosts", func(t *testing.T) {
		ms := nHosts(t, backend, 4, nil)
		busy(t, ms[0].path("c/.lock"), os.DevNull, 3)
		time.Sleep(2 * time.Second)
		got := make(chan string, 3)
		for _, m := range ms[1:] {
			go func() {
				d, ok := waitOnce(t, m.path("c/.lock"), bound)
				got <- fmt.Sprintf("%v %v", ok, d.Round(time.Millisecond))
			}()
		}
		for range ms[1:] {
			if r := <-got; !strings.HasPrefix(r, "true") {
				t.Errorf("a waiter did not get the lock within %v: %s", bound, r)
			} else {
				t.Logf("a waiter got the lock after %s", strings.TrimPrefix(r, "true "))
			}
		}
	})
	t.Run("4-hosts-busy", func(t *testing.T) {
		ms := nHosts(t, backend, 4, nil)
		dir := t.TempDir()
		var ps []*proc
		for i, m := range ms {
			ps = append(ps, busy(t, m.path("c/.lock"), filepath.Join(dir, strconv.Itoa(i)), 2))
		}
		time.Sleep(15 * time.Second)
		for _, p := range ps {
			p.kill()
		}
		var counts []int
		lo, hi := -1, 0
		for i := range ms {
			n := lines(t, filepath.Join(dir, strconv.Itoa(i)))
			counts = append(counts, n)
			if lo < 0 || n < lo {
				lo = n
			}
			hi = max(hi, n)
		}
		t.Logf("grants per host in 15 s, all under continuous demand: %v (min ÷ max %.2f)", counts, float64(lo)/float64(max(hi, 1)))
		if lo == 0 {
			t.Errorf("a host got no grant in 15 s: %v", counts)
		}
	})
}
