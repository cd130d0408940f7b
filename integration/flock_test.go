package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// Each test here pairs an expectation with a control: the same check in a
// situation where the opposite answer is right, so that a check that always
// passes would fail somewhere.

func TestFlockModes(t *testing.T) {
	m := mount(t)
	lock := m.path("a/.lock")

	t.Run("exclusive excludes exclusive and shared", func(t *testing.T) {
		h := holder(t, lock, "-x")
		expectCode(t, "flock -n -x while held exclusively", flockN(t, lock, "-x"), 1)
		expectCode(t, "flock -n -s while held exclusively", flockN(t, lock, "-s"), 1)
		h.kill()
		// Control: once the holder is gone, both succeed (release is
		// asynchronous, so allow it a moment).
		if !testutil.Poll(5*time.Second, func() bool { return flockN(t, lock, "-x").code == 0 }) {
			t.Errorf("flock -n -x after the holder died: still busy: %v", flockN(t, lock, "-x"))
		}
		expectCode(t, "flock -n -s after release", flockN(t, lock, "-s"), 0)
	})

	t.Run("shared with shared coexist", func(t *testing.T) {
		h := holder(t, lock, "-s")
		expectCode(t, "flock -n -s while held shared", flockN(t, lock, "-s"), 0)
		// A second long-lived shared holder, then exclusive is refused.
		h2 := holder(t, lock, "-s")
		expectCode(t, "flock -n -x while held shared twice", flockN(t, lock, "-x"), 1)
		h.kill()
		h2.kill()
	})

	t.Run("nonblocking answers 1 while held", func(t *testing.T) {
		h := holder(t, lock, "-x")
		r := flockN(t, lock)
		expectCode(t, "flock -n on a held lock", r, 1)
		if r.took > 5*time.Second {
			t.Errorf("flock -n took %v: it must answer at once", r.took)
		}
		// Control: a different directory's lock is free.
		expectCode(t, "flock -n on c/.lock", flockN(t, m.path("c/.lock")), 0)
		h.kill()
	})

	t.Run("wait timeout leaves nothing behind", func(t *testing.T) {
		h := holder(t, lock, "-x")
		r := run(t, 20*time.Second, "flock", "-w", "1", lock, "true")
		expectCode(t, "flock -w 1 on a held lock", r, 1)
		if r.took < 900*time.Millisecond || r.took > 10*time.Second {
			t.Errorf("flock -w 1 returned after %v; want about 1s", r.took)
		}
		// The abandoned wait must not linger as a waiter or a hold: once the
		// holder is gone, a non-blocking lock succeeds.
		h.kill()
		if !testutil.Poll(5*time.Second, func() bool { return flockN(t, lock, "-x").code == 0 }) {
			t.Errorf("after a timed-out wait and the holder's death, flock -n -x is still refused: %v", flockN(t, lock, "-x"))
		}
		// The probe's own hold goes with its RELEASE, which the kernel
		// sends after the probe has exited: poll.
		var st string
		if !testutil.Poll(5*time.Second, func() bool {
			st = readStatus(t, lock)
			return strings.Contains(st, "waiters 0") && strings.Contains(st, "mode none")
		}) {
			t.Errorf("status after everything was released:\n%s", st)
		}
	})
}

func TestFlockHierarchy(t *testing.T) {
	m := mount(t)

	t.Run("ancestor exclusive blocks a descendant", func(t *testing.T) {
		h := holder(t, m.path("a/.lock"), "-x")
		expectCode(t, "flock -n a/b/.lock while a/.lock is held exclusively", flockN(t, m.path("a/b/.lock")), 1)
		expectCode(t, "flock -n -s a/b/.lock while a/.lock is held exclusively", flockN(t, m.path("a/b/.lock"), "-s"), 1)
		// Control: a sibling tree is unaffected.
		expectCode(t, "flock -n c/.lock (sibling)", flockN(t, m.path("c/.lock")), 0)
		expectCode(t, "flock -n b/.lock (sibling)", flockN(t, m.path("b/.lock")), 0)
		h.kill()
	})

	t.Run("descendant blocks an ancestor exclusive", func(t *testing.T) {
		h := holder(t, m.path("a/b/.lock"), "-x")
		expectCode(t, "flock -n -x a/.lock while a/b/.lock is held", flockN(t, m.path("a/.lock"), "-x"), 1)
		// Control: the implicit hold on a is shared, so shared on a is fine,
		// and the sibling c is free.
		expectCode(t, "flock -n -s a/.lock while a/b/.lock is held", flockN(t, m.path("a/.lock"), "-s"), 0)
		expectCode(t, "flock -n -x c/.lock (sibling)", flockN(t, m.path("c/.lock"), "-x"), 0)
		h.kill()
	})

	t.Run("root lock covers everything", func(t *testing.T) {
		h := holder(t, m.path(".lock"), "-x")
		expectCode(t, "flock -n c/.lock while /.lock is held", flockN(t, m.path("c/.lock")), 1)
		h.kill()
		if !testutil.Poll(5*time.Second, func() bool { return flockN(t, m.path("c/.lock")).code == 0 }) {
			t.Error("c/.lock still refused after the root holder died")
		}
	})
}

func TestFlockLineage(t *testing.T) {
	m := mount(t)
	a, ab := m.path("a/.lock"), m.path("a/b/.lock")

	// A child runs under its parent's locks. With a regression these would
	// hang: the timeout turns that into a failure.
	r := run(t, 15*time.Second, "flock", a, "-c", fmt.Sprintf("flock %s true", ab))
	expectCode(t, "flock a/.lock -c 'flock a/b/.lock true'", r, 0)
	r = run(t, 15*time.Second, "flock", "-x", a, "-c", fmt.Sprintf("flock -x %s true", a))
	expectCode(t, "flock -x a/.lock -c 'flock -x a/.lock true' (re-taking the caller's lock)", r, 0)
	r = run(t, 15*time.Second, "flock", "-x", a, "-c", fmt.Sprintf("sh -c 'flock -x %s -c \"flock -s %s true\"'", ab, a))
	expectCode(t, "grandchild re-taking the grandparent's lock", r, 0)

	// Control: the same inner request from a stranger (not a descendant of
	// the holder) is refused.
	h := holder(t, a, "-x")
	expectCode(t, "a stranger's flock -n a/b/.lock while a/.lock is held", flockN(t, ab), 1)
	expectCode(t, "a stranger's flock -n -x a/.lock while a/.lock is held", flockN(t, a, "-x"), 1)
	h.kill()
}

func TestUsageRule(t *testing.T) {
	m := mount(t)
	a, usage, b := m.path("a/.lock"), m.path("a/.lock_usage"), m.path("b/.lock")

	// Holding a usage lock, no new lock may be taken: EDEADLK.
	r := run(t, 15*time.Second, "flock", a, "-c",
		fmt.Sprintf(`flock -x %s -c "flock -n %s true"`, usage, b))
	if r.code == 0 || r.timedOut || !strings.Contains(r.stderr, "Resource deadlock avoided") {
		t.Errorf("a new lock under a usage lock: want EDEADLK (\"Resource deadlock avoided\"), got %v", r)
	}
	// Control: the same chain without the usage lock succeeds.
	r = run(t, 15*time.Second, "flock", a, "-c", fmt.Sprintf(`flock -n %s true`, b))
	expectCode(t, "the same new lock without a usage lock", r, 0)
	// Control: taking the usage lock itself under the directory lock works.
	r = run(t, 15*time.Second, "flock", a, "-c", fmt.Sprintf(`flock -x %s true`, usage))
	expectCode(t, "flock -x a/.lock_usage under a/.lock", r, 0)

	// Shared on a usage lock is invalid.
	r = run(t, 15*time.Second, "flock", "-s", usage, "true")
	if r.code == 0 || r.timedOut || !strings.Contains(r.stderr, "Invalid argument") {
		t.Errorf("flock -s a/.lock_usage: want EINVAL (\"Invalid argument\"), got %v", r)
	}
}

func TestNewDirLock(t *testing.T) {
	m := mount(t)
	nd := m.path("a/.lock_newdir")
	h := holder(t, nd, "-x")
	expectCode(t, "a stranger's flock -n -s a/.lock_newdir while held exclusively", flockN(t, nd, "-s"), 1)
	// A new-dir lock holds the directory lock shared: exclusive on a/.lock
	// must wait, shared is fine.
	expectCode(t, "flock -n -x a/.lock while a/.lock_newdir is held", flockN(t, m.path("a/.lock"), "-x"), 1)
	expectCode(t, "flock -n -s a/.lock while a/.lock_newdir is held", flockN(t, m.path("a/.lock"), "-s"), 0)
	// Control: another directory's new-dir lock is free.
	expectCode(t, "flock -n -x c/.lock_newdir", flockN(t, m.path("c/.lock_newdir"), "-x"), 0)
	h.kill()
}

// deadlockScript holds FIRST with fcntl.flock, prints "held", waits for a
// line on stdin, then asks for SECOND and prints "ok" or "errno N".
const deadlockScript = `
import fcntl, os, sys
first, second = sys.argv[1], sys.argv[2]
f1 = open(first, "rb")
fcntl.flock(f1, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
f2 = open(second, "rb")
try:
    fcntl.flock(f2, fcntl.LOCK_EX)
    print("ok", flush=True)
except OSError as e:
    print("errno %d" % e.errno, flush=True)
sys.stdin.readline()
`

func TestDeadlockDetected(t *testing.T) {
	require(t, "python3")
	m := mount(t)
	a, b := m.path("a/.lock"), m.path("b/.lock")

	p1 := startPython(t, deadlockScript, a, b)
	p2 := startPython(t, deadlockScript, b, a)
	p1.waitLine("held", 15*time.Second)
	p2.waitLine("held", 15*time.Second)

	// P1 waits for b (held by P2)...
	fmt.Fprintln(p1.stdin, "go")
	if line, ok := p1.nextLine(500 * time.Millisecond); ok {
		t.Fatalf("P1 should wait for b/.lock, but printed %q", line)
	}
	// ...then P2 asks for a (held by P1): a cycle, refused at once.
	fmt.Fprintln(p2.stdin, "go")
	line, ok := p2.nextLine(10 * time.Second)
	if !ok || line != "errno 35" {
		t.Fatalf("P2 closing a cycle of waits: want \"errno 35\" (EDEADLK), got %q (ok=%v); stderr %q", line, ok, p2.stderr.String())
	}
	// P2 gives up b: P1's wait is granted (control: P1 was really waiting
	// and is not refused too).
	fmt.Fprintln(p2.stdin, "done")
	if code, ok := p2.wait(10 * time.Second); !ok || code != 0 {
		t.Fatalf("P2 did not exit: %d %v", code, ok)
	}
	line, ok = p1.nextLine(10 * time.Second)
	if !ok || line != "ok" {
		t.Fatalf("P1 after P2 released: want \"ok\", got %q (ok=%v); stderr %q", line, ok, p1.stderr.String())
	}
	fmt.Fprintln(p1.stdin, "done")
	p1.wait(10 * time.Second)
}

// readStatus reads a control file's status text.
func readStatus(t *testing.T, path string) string {
	t.Helper()
	r := run(t, 10*time.Second, "cat", path)
	if r.code != 0 {
		t.Fatalf("cat %s: %v", path, r)
	}
	return r.stdout
}
