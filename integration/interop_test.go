package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// lockfScript takes fcntl.lockf (a POSIX record lock) on a control file.
// "hold": take LOCK_EX, print "held", wait for stdin to close.
// "try": try LOCK_EX|LOCK_NB once and print "ok" or "errno N".
const lockfScript = `
import fcntl, os, sys
action, path = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
if action == "hold":
    fcntl.lockf(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.read()
else:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("ok", flush=True)
    except OSError as e:
        print("errno %d" % e.errno, flush=True)
`

func TestPOSIXAndFlockExcludeEachOther(t *testing.T) {
	require(t, "python3")
	m := mount(t)
	a := m.path("a/.lock")

	try := func(path string) string {
		t.Helper()
		r := run(t, 15*time.Second, "python3", "-c", lockfScript, "try", path)
		if r.code != 0 {
			t.Fatalf("python3 lockf try %s: %v", path, r)
		}
		return strings.TrimSpace(r.stdout)
	}

	t.Run("flock holder excludes lockf", func(t *testing.T) {
		h := holder(t, a, "-x")
		if got := try(a); got != fmt.Sprintf("errno %d", syscall.EAGAIN) && got != fmt.Sprintf("errno %d", syscall.EACCES) {
			t.Errorf("lockf(LOCK_NB) on a/.lock held with flock(1): want EAGAIN or EACCES, got %q", got)
		}
		// Control: lockf on another directory's lock succeeds.
		if got := try(m.path("c/.lock")); got != "ok" {
			t.Errorf("lockf(LOCK_NB) on c/.lock: want ok, got %q", got)
		}
		h.kill()
	})

	t.Run("lockf holder excludes flock", func(t *testing.T) {
		p := startPython(t, lockfScript, "hold", a)
		p.waitLine("held", 15*time.Second)
		expectCode(t, "flock -n a/.lock while python holds lockf", flockN(t, a), 1)
		expectCode(t, "flock -n -s a/.lock while python holds lockf", flockN(t, a, "-s"), 1)
		// Control: when the python process ends, its POSIX lock goes.
		p.stdin.Close()
		if code, ok := p.wait(10 * time.Second); !ok || code != 0 {
			t.Fatalf("python holder did not exit cleanly: %d %v; stderr %q", code, ok, p.stderr.String())
		}
		if !testutil.Poll(5*time.Second, func() bool { return flockN(t, a).code == 0 }) {
			t.Errorf("flock -n a/.lock after the lockf holder exited: still busy")
		}
	})
}

func TestKillHolderFreesLock(t *testing.T) {
	m := mount(t)
	a := m.path("a/.lock")

	for _, tc := range []struct {
		name  string
		flags []string
	}{
		// Without -o the command inherits the descriptor: kill the group.
		{"kill -9 of the holder's process group", []string{"-x"}},
		// With -o only flock(1) holds the descriptor: kill flock alone.
		{"kill -9 of flock -o", []string{"-x", "-o"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := holder(t, a, tc.flags...)
			w := start(t, "flock", "-x", a, "true")
			// Control: the waiter really waits while the holder lives.
			if code, done := w.wait(500 * time.Millisecond); done {
				t.Fatalf("the waiter finished (exit %d) while the lock was held", code)
			}
			if len(tc.flags) > 1 {
				syscall.Kill(h.pid(), syscall.SIGKILL)
			} else {
				syscall.Kill(-h.pid(), syscall.SIGKILL)
			}
			start := time.Now()
			code, done := w.wait(10 * time.Second)
			if !done || code != 0 {
				t.Fatalf("the waiter after kill -9 of the holder: done=%v exit=%d; stderr %q", done, code, w.stderr.String())
			}
			t.Logf("waiter granted %v after the kill", time.Since(start).Round(time.Millisecond))
			h.kill()
		})
	}
}

func TestSourceLockInterop(t *testing.T) {
	m := mount(t)
	mntA, srcA := m.path("a/.lock"), m.srcPath("a/..LOCK")

	t.Run("direct lock on SOURCE blocks the mount", func(t *testing.T) {
		h := holder(t, srcA, "-x")
		expectCode(t, "flock -n MNT/a/.lock while SOURCE/a/..LOCK is held", flockN(t, mntA), 1)
		expectCode(t, "flock -n MNT/a/b/.lock while SOURCE/a/..LOCK is held", flockN(t, m.path("a/b/.lock")), 1)
		// Control: another directory is free.
		expectCode(t, "flock -n MNT/c/.lock", flockN(t, m.path("c/.lock")), 0)
		h.kill()
		if !testutil.Poll(5*time.Second, func() bool { return flockN(t, mntA).code == 0 }) {
			t.Error("MNT/a/.lock still busy after the direct SOURCE holder died")
		}
	})

	t.Run("mount lock blocks a direct lock on SOURCE", func(t *testing.T) {
		h := holder(t, mntA, "-x")
		expectCode(t, "flock -n SOURCE/a/..LOCK while MNT/a/.lock is held", flockN(t, srcA), 1)
		// Control: SOURCE/c/..LOCK is free.
		expectCode(t, "flock -n SOURCE/c/..LOCK", flockN(t, m.srcPath("c/..LOCK")), 0)
		h.kill()
		if !testutil.Poll(5*time.Second, func() bool { return flockN(t, srcA).code == 0 }) {
			t.Error("SOURCE/a/..LOCK still busy after the mount holder died")
		}
	})

	t.Run("implicit ancestor holds reach SOURCE", func(t *testing.T) {
		h := holder(t, m.path("a/b/.lock"), "-x")
		expectCode(t, "flock -n -x SOURCE/a/..LOCK while MNT/a/b/.lock is held", flockN(t, srcA, "-x"), 1)
		// Control: the ancestor hold is shared.
		expectCode(t, "flock -n -s SOURCE/a/..LOCK while MNT/a/b/.lock is held", flockN(t, srcA, "-s"), 0)
		h.kill()
	})
}

var holderLine = regexp.MustCompile(`(?m)^holder .*$`)

func TestStatus(t *testing.T) {
	m := mount(t)
	a := m.path("a/.lock")

	// Control: nobody holds it yet.
	st := readStatus(t, a)
	if !strings.Contains(st, "mode none") || holderLine.MatchString(st) {
		t.Errorf("status of a free lock: want mode none and no holder, got:\n%s", st)
	}
	for _, want := range []string{"lock a/.lock\n", "kind dir\n", "waiters 0\n"} {
		if !strings.Contains(st, want) {
			t.Errorf("status of a free lock lacks %q:\n%s", want, st)
		}
	}

	h := holder(t, a, "-x")
	st = readStatus(t, a)
	line := holderLine.FindString(st)
	if !strings.Contains(st, "mode exclusive\n") || line == "" {
		t.Fatalf("status while held exclusively: want mode exclusive and a holder line, got:\n%s", st)
	}
	for _, want := range []string{"pid=" + strconv.Itoa(h.pid()), "mode=exclusive", "explicit", "uid=0"} {
		if !strings.Contains(" "+line+" ", " "+want+" ") {
			t.Errorf("holder line lacks %q: %q", want, line)
		}
	}
	if strings.HasPrefix(st, "you ") {
		t.Errorf("a reader that does not hold the lock is told it does:\n%s", st)
	}

	// A waiter shows in the count.
	w := start(t, "flock", "-s", a, "true")
	if !testutil.Poll(5*time.Second, func() bool { return strings.Contains(readStatus(t, a), "waiters 1\n") }) {
		t.Errorf("status with one waiter: want \"waiters 1\", got:\n%s", readStatus(t, a))
	}
	// An implicit hold from below shows on the ancestor.
	st = readStatus(t, m.path(".lock"))
	if !strings.Contains(st, "mode shared\n") || !strings.Contains(st, "implicit=") {
		t.Errorf("status of the root while a/.lock is held: want an implicit shared hold, got:\n%s", st)
	}
	w.kill()
	h.kill()

	// Read through the descriptor that holds the lock: "you" comes first.
	holderFirstLine(t, a)
}

// holderFirstLine takes path's lock exclusively with flock(1) on a
// descriptor and returns the first line of the status read through it,
// which names the reader's own token ("you holder token=N").
func holderFirstLine(t *testing.T, path string) string {
	t.Helper()
	r := sh(t, 15*time.Second, fmt.Sprintf(`exec 9<%s && flock -x 9 && head -n 1 <&9`, path))
	if r.code != 0 || !strings.HasPrefix(r.stdout, "you holder token=") {
		t.Fatalf("status read through the holding descriptor of %s: %v", path, r)
	}
	return strings.TrimSpace(r.stdout)
}

// TestTokenIssuedWhenRead: a lock through the mount whose fencing token
// nobody reads leaves the counter in its backing file alone, so a flock
// pair writes nothing to SOURCE; the token is issued, and written, when
// the holder reads its status (or `lockfs lock` does, for LOCKFS_TOKEN),
// and each one read is greater than the last. Control: those reads move
// the counter, so the check of the unread grants can see a write.
func TestTokenIssuedWhenRead(t *testing.T) {
	m := mount(t, withSetup(func(src string) {
		if err := os.MkdirAll(filepath.Join(src, "a"), 0o755); err != nil {
			t.Fatal(err)
		}
	}))
	a := m.path("a/.lock")
	counter := func() string {
		t.Helper()
		b, err := os.ReadFile(m.srcPath("a", "..LOCK"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	readToken := func() string {
		t.Helper()
		return strings.TrimPrefix(holderFirstLine(t, a), "you holder token=")
	}
	unread := func() {
		t.Helper()
		r := sh(t, 60*time.Second, fmt.Sprintf(`for i in $(seq 20); do flock -x %[1]s true && flock -s %[1]s true || exit 1; done`, a))
		if r.code != 0 {
			t.Fatalf("flock pairs: %v", r)
		}
	}

	unread()
	if c := counter(); c != "" {
		t.Fatalf("after 40 unread grants the counter reads %q, want nothing written", c)
	}
	if tok := readToken(); tok != "1" {
		t.Fatalf("first token read: %q, want 1", tok)
	}
	if c := counter(); c != "1" {
		t.Fatalf("control: after the token was read the counter reads %q, want 1", c)
	}
	unread()
	if c := counter(); c != "1" {
		t.Fatalf("after 40 more unread grants the counter reads %q, want 1", c)
	}
	if tok := readToken(); tok != "2" {
		t.Fatalf("second token read: %q, want 2", tok)
	}
	r := run(t, 30*time.Second, lockfsBin, "lock", m.path("a"), "--", "sh", "-c", `echo "$LOCKFS_TOKEN"`)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "3" {
		t.Fatalf("lockfs lock through the mount: LOCKFS_TOKEN: %v, want 3", r)
	}
	if c := counter(); c != "3" {
		t.Fatalf("after lockfs lock the counter reads %q, want 3", c)
	}
	// lockfs status shows a holder's token, issuing it if nobody had.
	h := holder(t, a)
	defer h.kill()
	if c := counter(); c != "3" {
		t.Fatalf("with an unread holder the counter reads %q, want 3", c)
	}
	r = run(t, 10*time.Second, lockfsBin, "status", "--json", m.path("a"))
	if r.code != 0 || !strings.Contains(r.stdout, `"token": 4`) {
		t.Fatalf("lockfs status --json with a holder: want its token 4: %v", r)
	}
	if c := counter(); c != "4" {
		t.Fatalf("after lockfs status the counter reads %q, want 4", c)
	}
}

// TestCounter: 16 processes each increment a counter 50 times. Under
// flock -x the result is exact; without it, updates are lost (the control
// that shows the test can detect a lock that does not exclude).
func TestCounter(t *testing.T) {
	m := mount(t)
	counter := m.path("c/counter")
	const workers, rounds = 16, 50

	count := func(lock bool) int {
		t.Helper()
		sh(t, 10*time.Second, fmt.Sprintf("echo 0 > %s", counter))
		incr := fmt.Sprintf(`sh -c 'n=$(cat %s); echo $((n+1)) > %s'`, counter, counter)
		if lock {
			incr = fmt.Sprintf("flock -x %s %s", m.path("c/.lock"), incr)
		}
		script := fmt.Sprintf("i=0; while [ $i -lt %d ]; do %s; i=$((i+1)); done", rounds, incr)
		var ps []*proc
		for range workers {
			ps = append(ps, start(t, "sh", "-c", script))
		}
		// The 800 critical sections (each a flock(1), an sh and a cat)
		// take 15-60 s on a quiet 2-core machine; under a load average of
		// 40-90 they took over 3 minutes. The bound only catches a hang.
		deadline := time.Now().Add(8 * time.Minute)
		for i, p := range ps {
			if code, ok := p.wait(max(time.Until(deadline), time.Second)); !ok || code != 0 {
				t.Fatalf("worker %d: exit %d, finished %v; stderr %q", i, code, ok, p.stderr.String())
			}
		}
		r := sh(t, 10*time.Second, "cat "+counter)
		n, err := strconv.Atoi(strings.TrimSpace(r.stdout))
		if err != nil {
			t.Fatalf("counter: %v (%v)", err, r)
		}
		return n
	}

	start := time.Now()
	if n := count(true); n != workers*rounds {
		t.Errorf("counter under flock -x: got %d, want exactly %d", n, workers*rounds)
	}
	t.Logf("locked: %d increments in %v", workers*rounds, time.Since(start).Round(time.Millisecond))

	for attempt := 1; ; attempt++ {
		n := count(false)
		if n < workers*rounds {
			t.Logf("control without flock lost %d updates (attempt %d)", workers*rounds-n, attempt)
			break
		}
		if attempt == 3 {
			t.Errorf("control: without flock the counter reached %d three times; the test cannot show lost updates", n)
			break
		}
	}
}
