package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"
)

// stormTrials is the number of kill-during-wait trials: 300 by default,
// LOCKFS_STORM_TRIALS to change it (make storm runs 10,000).
func stormTrials(t *testing.T) int {
	s := os.Getenv("LOCKFS_STORM_TRIALS")
	if s == "" {
		return 300
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("LOCKFS_STORM_TRIALS=%q: want a positive number", s)
	}
	return n
}

// inFlock reports whether the process is inside the flock(2) system call,
// from /proc/PID/syscall (its first field is the syscall number).
func inFlock(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid))
	if err != nil {
		return false
	}
	return strings.HasPrefix(string(b), strconv.Itoa(unix.SYS_FLOCK)+" ")
}

// spin waits d by spinning: time.Sleep is too coarse for microseconds.
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// waiter is one trial's `flock a/.lock true`.
type waiter struct {
	cmd    *exec.Cmd
	when   string // when it was killed, for messages
	reaped chan struct{}
}

func startWaiter(t *testing.T, lock string) *waiter {
	t.Helper()
	cmd := exec.Command("flock", lock, "true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &waiter{cmd: cmd, reaped: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(w.reaped)
	}()
	return w
}

// TestKillDuringWaitStorm SIGKILLs waiters at random instants around the
// start of their lock wait. Each must die: none may be left in state D
// (uninterruptible), however the kill races with the FUSE request. See
// FUSE-NOTES.md on bazil dropping early interrupts.
func TestKillDuringWaitStorm(t *testing.T) {
	m := mount(t)
	lock := m.path("a/.lock")
	trials := stormTrials(t)
	h := holder(t, lock, "-x")

	// Control: the detector sees a waiter stuck in D. Freeze the daemon, so
	// that nobody answers, and SIGKILL a waiter that is in its lock wait:
	// the kernel must wait for the daemon's answer in state D.
	t.Run("control: a frozen daemon leaves a killed waiter in D", func(t *testing.T) {
		w := startWaiter(t, lock)
		if !testutil.Poll(10*time.Second, func() bool { return inFlock(w.cmd.Process.Pid) }) {
			w.cmd.Process.Kill()
			t.Fatal("the waiter never entered flock(2)")
		}
		// The daemon has read the request once the lock's status counts
		// the waiter. Until then a SIGKILL takes the request back from
		// the kernel's queue, and the waiter dies at once (a fixed 50 ms
		// sleep here was too short once on a loaded CI machine).
		if !testutil.Poll(10*time.Second, func() bool { return strings.Contains(readStatus(t, lock), "waiters 1\n") }) {
			w.cmd.Process.Kill()
			t.Fatalf("the lock's status never counted the waiter:\n%s", readStatus(t, lock))
		}
		syscall.Kill(m.Pid(), syscall.SIGSTOP)
		defer syscall.Kill(m.Pid(), syscall.SIGCONT)
		w.cmd.Process.Kill()
		time.Sleep(300 * time.Millisecond)
		st := procState(w.cmd.Process.Pid)
		syscall.Kill(m.Pid(), syscall.SIGCONT)
		if st != 'D' {
			t.Errorf("killed waiter of a frozen daemon: state %q, want 'D' (the stuck-waiter check could not see a stuck waiter)", st)
		}
		select {
		case <-w.reaped:
		case <-time.After(10 * time.Second):
			t.Fatalf("the killed waiter was not reaped after the daemon resumed (state %q)", procState(w.cmd.Process.Pid))
		}
	})

	// Calibrate: how long after Start returns does a waiter enter flock(2)?
	var entry []time.Duration
	for range 20 {
		w := startWaiter(t, lock)
		t0 := time.Now()
		for !inFlock(w.cmd.Process.Pid) && time.Since(t0) < 5*time.Second {
		}
		entry = append(entry, time.Since(t0))
		w.cmd.Process.Kill()
		<-w.reaped
	}
	slices.Sort(entry)
	median := entry[len(entry)/2]
	t.Logf("a waiter enters flock(2) %v after exec (median of 20; min %v, max %v)", median, entry[0], entry[len(entry)-1])

	// The trials cycle through three kinds of instants: 0-200µs after exec
	// returns (the waiter starting up), 0-200µs after the waiter is seen
	// entering flock(2) (its LockWait request and the Interrupt race inside
	// the daemon), and 0-200µs around the median entry into flock(2).
	const batch = 25
	var granted, done, inWait int
	var leftover []*waiter
	for done < trials {
		n := min(batch, trials-done)
		ws := make([]*waiter, 0, n)
		for i := range n {
			w := startWaiter(t, lock)
			pid := w.cmd.Process.Pid
			d := rand.N(200 * time.Microsecond)
			switch (done + i) % 3 {
			case 0:
				w.when = fmt.Sprintf("%v after exec", d)
			case 1:
				t0 := time.Now()
				for !inFlock(pid) && time.Since(t0) < time.Second {
				}
				w.when = fmt.Sprintf("%v after entering flock(2)", d)
			case 2:
				d += max(0, median-100*time.Microsecond)
				w.when = fmt.Sprintf("%v after exec", d)
			}
			spin(d)
			if inFlock(pid) {
				inWait++
			}
			w.cmd.Process.Kill()
			ws = append(ws, w)
		}
		for _, w := range ws {
			select {
			case <-w.reaped:
				if w.cmd.ProcessState.ExitCode() == 0 {
					granted++
				}
			case <-time.After(5 * time.Second):
				t.Errorf("waiter pid %d, SIGKILLed %s: not reaped 5s later, state %q (D: stuck in the lock wait)",
					w.cmd.Process.Pid, w.when, procState(w.cmd.Process.Pid))
				leftover = append(leftover, w)
			}
		}
		done += n
		if len(leftover) > 0 {
			break
		}
	}
	if granted > 0 {
		t.Errorf("%d waiters were granted the lock while it was held exclusively", granted)
	}
	t.Logf("%d kill-during-wait trials, %d killed inside flock(2), %d stuck", done, inWait, len(leftover))
	// Control: the storm must actually kill waiters inside their lock wait.
	if inWait < done/10 {
		t.Errorf("only %d of %d waiters were killed inside flock(2): the storm does not exercise the lock wait", inWait, done)
	}

	// Nothing is left behind: once the holder goes, the lock is free.
	h.kill()
	for _, w := range leftover {
		select {
		case <-w.reaped:
		case <-time.After(10 * time.Second):
			t.Errorf("stuck waiter pid %d still not reaped after the holder died", w.cmd.Process.Pid)
		}
	}
	if !testutil.Poll(10*time.Second, func() bool { return flockN(t, lock, "-x").code == 0 }) {
		t.Errorf("after the storm and the holder's death, flock -n -x a/.lock is refused: %v; status:\n%s",
			flockN(t, lock, "-x"), readStatus(t, lock))
	}
	if st := readStatus(t, lock); !strings.Contains(st, "waiters 0\n") {
		t.Errorf("waiters left after the storm:\n%s", st)
	}
}
