package fs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// flockHold starts `flock ARGS F -c 'echo locked; exec sleep 60'` and
// waits until it holds the lock.
func flockHold(t *testing.T, f string, args ...string) int {
	t.Helper()
	a := append(append([]string{}, args...), f, "-c", "echo locked; exec sleep 60")
	return startLine(t, "locked", "flock", a...).Process.Pid
}

// flockNB tries the lock without waiting and reports whether it got it.
func flockNB(t *testing.T, mode, f string) bool {
	t.Helper()
	code, out := runExit(t, 10*time.Second, "flock", "-n", mode, f, "true")
	switch code {
	case 0:
		return true
	case 1:
		return false
	}
	t.Fatalf("flock -n %s %s: exit %d: %s", mode, f, code, out)
	return false
}

func TestFlockModes(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a/b", "c")
	flockHold(t, m.path("a/.lock"), "-x")
	if flockNB(t, "-x", m.path("a/.lock")) || flockNB(t, "-s", m.path("a/.lock")) {
		t.Error("a second process took a/.lock while it is held exclusively")
	}
	if flockNB(t, "-s", m.path("a/b/.lock")) {
		t.Error("a/b/.lock was granted under an exclusive a/.lock")
	}
	// Control: an unrelated directory, the root's other kinds, and a
	// different lock kind of a are free.
	if !flockNB(t, "-x", m.path("c/.lock")) || !flockNB(t, "-x", m.path(".lock_newdir")) {
		t.Error("an unrelated lock was refused while a/.lock is held")
	}

	// Shared with shared.
	flockHold(t, m.path("c/.lock"), "-s")
	if !flockNB(t, "-s", m.path("c/.lock")) {
		t.Error("shared refused while only shared is held")
	}
	if flockNB(t, "-x", m.path("c/.lock")) {
		t.Error("exclusive granted while shared is held")
	}
}

func TestFlockWaitTimesOutAndLeavesNothing(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a")
	f := m.path("a/.lock")
	holder := flockHold(t, f, "-x")

	// Control: a blocked waiter shows in the status.
	waiter := startPy(t, 0, 0)
	waiter.must("ok", "open f %s", f)
	waiter.send("flock f ex")
	testutil.Eventually(t, "the waiter to queue", func() bool { return strings.Contains(m.status("a/.lock"), "\nwaiters 1\n") })
	waiter.kill()
	testutil.Eventually(t, "the killed waiter to leave the queue", func() bool {
		return strings.Contains(m.status("a/.lock"), "\nwaiters 0\n")
	})

	start := time.Now()
	code, out := runExit(t, 20*time.Second, "flock", "-w", "1", f, "true")
	if code != 1 {
		t.Fatalf("flock -w 1 on a held lock: exit %d: %s", code, out)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("flock -w 1 took %v", d)
	}
	st := m.status("a/.lock")
	if !strings.Contains(st, "\nwaiters 0\n") || strings.Count(st, "\nholder ") != 1 {
		t.Errorf("after the timed-out waiter:\n%s", st)
	}
	syscall.Kill(-holder, syscall.SIGKILL)
	testutil.Eventually(t, "the lock to be free", func() bool { return flockNB(t, "-x", f) })
	// The probe's own hold goes with its RELEASE, which the kernel sends
	// after its close(2) returns: poll the status.
	if !testutil.Poll(testutil.DefaultWait, func() bool {
		st = m.status("a/.lock")
		return !strings.Contains(st, "holder") && strings.Contains(st, "\nmode none\n")
	}) {
		t.Errorf("after everyone left:\n%s", st)
	}
}

func TestFlockLineage(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a/b")
	// A child runs under its parent's lock.
	code, out := runExit(t, 10*time.Second, "flock", "-x", m.path("a/.lock"), "-c",
		fmt.Sprintf("flock -x %s true && flock -x %s true", m.path("a/b/.lock"), m.path("a/.lock")))
	if code != 0 {
		t.Errorf("nested flock: exit %d: %s", code, out)
	}
	// Control: a stranger waits.
	flockHold(t, m.path("a/.lock"), "-x")
	if flockNB(t, "-x", m.path("a/b/.lock")) {
		t.Error("a stranger took a/b/.lock under another process's exclusive a/.lock")
	}
}

func TestFlockAndLockfExcludeEachOther(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a", "b")
	p := startPy(t, 0, 0)
	p.must("ok", "open f %s", m.path("a/.lock"))
	p.must("ok", "lockf f ex")
	if flockNB(t, "-x", m.path("a/.lock")) || flockNB(t, "-s", m.path("a/.lock")) {
		t.Error("flock(1) got a/.lock while python holds it with lockf")
	}
	// Control: another directory is free for flock(1).
	if !flockNB(t, "-x", m.path("b/.lock")) {
		t.Error("flock(1) refused b/.lock")
	}
	p.must("ok", "lockf f un")
	if !flockNB(t, "-x", m.path("a/.lock")) {
		t.Error("a/.lock still held after lockf unlock")
	}

	// The other way round.
	flockHold(t, m.path("b/.lock"), "-s")
	p.must("ok", "open g %s", m.path("b/.lock"))
	p.must("err EAGAIN", "lockf g ex nb")
	p.must("ok", "lockf g sh nb") // shared with shared
	p.must("err EAGAIN", "ofd g ex nb")
	p.must("err EAGAIN", "flock g ex nb")
}

func TestPOSIXReleasedAtAnyCloseOFDAtLast(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a", "b")
	f := m.path("a/.lock")

	// POSIX: closing any descriptor of the file drops the process's lock.
	p := startPy(t, 0, 0)
	p.must("ok", "open l %s", f)
	p.must("ok", "lockf l ex")
	p.must("ok", "open other %s", f)
	if flockNB(t, "-x", f) {
		t.Fatal("lockf lock not held")
	}
	p.must("ok", "close other")
	testutil.Eventually(t, "the POSIX lock to go at the close of another descriptor", func() bool { return flockNB(t, "-x", f) })

	// OFD: closing another descriptor keeps it; the last close drops it.
	g := m.path("b/.lock")
	p.must("ok", "open o %s", g)
	p.must("ok", "ofd o ex")
	p.must("ok", "open other %s", g)
	p.must("ok", "close other")
	// Release is asynchronous: wait until the daemon has seen it, so that
	// the check below cannot pass for coming too early.
	testutil.Eventually(t, "the release of the other open file description", func() bool { return m.openHandles("b/.lock") == 1 })
	if flockNB(t, "-x", g) {
		t.Fatal("the OFD lock went at the close of another open file description")
	}
	p.must("ok", "close o")
	testutil.Eventually(t, "the OFD lock to go at its last close", func() bool { return flockNB(t, "-x", g) })
}

func TestGetlk(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a", "b")
	holder := flockHold(t, m.path("a/.lock"), "-x")
	p := startPy(t, 0, 0)
	p.must("ok", "open f %s", m.path("a/.lock"))
	p.must(fmt.Sprintf("lk ex %d", holder), "getlk f sh")
	// Control: a free lock answers F_UNLCK.
	p.must("ok", "open g %s", m.path("b/.lock"))
	p.must("lk un 0", "getlk g ex")
}

func TestKilledHolderFreesWaiter(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a")
	f := m.path("a/.lock")
	holder := startPy(t, 0, 0)
	holder.must("ok", "open f %s", f)
	holder.must("ok", "flock f ex")

	waiter := startPy(t, 0, 0)
	waiter.must("ok", "open f %s", f)
	waiter.send("flock f ex")
	// Control: the waiter really waits while the holder lives. It is
	// queued in the engine first, so that the check cannot pass for
	// coming before the request arrived.
	testutil.Eventually(t, "the waiter to queue", func() bool { return strings.Contains(m.status("a/.lock"), "\nwaiters 1\n") })
	if r := waiter.reply(0); r != "" {
		t.Fatalf("waiter got %q while the lock is held", r)
	}
	holder.kill()
	if r := waiter.reply(10 * time.Second); r != "ok" {
		t.Fatalf("waiter after the holder was killed: %q", r)
	}
	if st := m.status("a/.lock"); !strings.Contains(st, fmt.Sprintf(" pid=%d ", waiter.pid)) {
		t.Errorf("status after handover:\n%s", st)
	}
}

func TestKilledWaitersNeverStick(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a")
	f := m.path("a/.lock")
	flockHold(t, f, "-x")
	// Many waiters SIGKILLed at once or shortly after they start: each
	// must die at once, not sit in D state until the lock is free.
	const n = 60
	var wg sync.WaitGroup
	stuck := make(chan int, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if !killAfter(time.Duration(i%6)*200*time.Microsecond, "flock", "-x", f, "true") {
				stuck <- i
			}
		}(i)
	}
	wg.Wait()
	close(stuck)
	for i := range stuck {
		t.Errorf("waiter %d did not die within 5 s of SIGKILL", i)
	}
	testutil.Eventually(t, "no waiters left", func() bool { return strings.Contains(m.status("a/.lock"), "\nwaiters 0\n") })
}

// killAfter starts a command, SIGKILLs it after d, and reports whether it
// was gone within 5 s.
func killAfter(d time.Duration, name string, args ...string) bool {
	cmd := exec.Command(name, args...)
	if err := cmd.Start(); err != nil {
		return true
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	time.Sleep(d)
	cmd.Process.Kill()
	select {
	case <-done:
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

func TestLockCounterNoLostUpdates(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a")
	counter := filepath.Join(t.TempDir(), "counter")
	run := func(lock bool) int {
		if err := os.WriteFile(counter, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		step := fmt.Sprintf(`v=$(cat %s); sleep 0.005; echo $((v+1)) > %s`, counter, counter)
		if lock {
			step = fmt.Sprintf(`flock -x %s -c '%s'`, m.path("a/.lock"), step)
		}
		script := fmt.Sprintf(`for w in 1 2 3 4; do (for i in $(seq 10); do %s; done) & done; wait`, step)
		if code, out := runExit(t, 60*time.Second, "bash", "-c", script); code != 0 {
			t.Fatalf("workers: exit %d: %s", code, out)
		}
		b, _ := os.ReadFile(counter)
		v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return v
	}
	// Control: without the lock, updates are lost.
	if v := run(false); v == 40 {
		t.Log("no update lost without the lock this time; the control proves nothing")
	} else {
		t.Logf("without the lock: %d of 40", v)
	}
	if v := run(true); v != 40 {
		t.Errorf("with the lock: counter %d, want 40", v)
	}
}

func TestLockErrors(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a", "open")
	if err := os.Chmod(filepath.Join(m.src, "open"), 0o777); err != nil {
		t.Fatal(err)
	}
	p := startPy(t, 0, 0)
	p.must("ok", "open u %s", m.path("a/.lock_usage"))
	p.must("err EINVAL", "flock u sh")
	p.must("err EINVAL", "lockf u sh")
	p.must("ok", "flock u ex")
	// SPEC §2.4: holding a usage lock, no new lock.
	p.must("ok", "open n %s", m.path("a/.lock_newdir"))
	p.must("err EDEADLK", "flock n sh nb")
	p.must("ok", "flock u un")
	p.must("ok", "flock n sh nb") // control: allowed once the usage lock is gone

	// Permissions are checked against the directory: a (0755, root) lets
	// nobody read, not write; open (0777) lets it write.
	nobody := startPy(t, 65534, 65534)
	nobody.must("ok", "open d %s", m.path("a/.lock"))
	nobody.must("ok", "flock d sh nb")
	nobody.must("ok", "flock d un")
	nobody.must("err EACCES", "flock d ex nb")
	nobody.must("err EACCES", "lockf d ex nb")
	nobody.must("ok", "open u %s", m.path("a/.lock_usage"))
	nobody.must("err EACCES", "flock u ex nb")
	nobody.must("ok", "open o %s", m.path("open/.lock"))
	nobody.must("ok", "flock o ex nb")
}

func TestLeaseLostGivesEIO(t *testing.T) {
	m := newCtlMount(t)
	m.mkdir("a")
	p := startPy(t, 0, 0)
	p.must("ok", "open f %s", m.path("a/.lock"))
	p.must("ok", "flock f ex")
	p.must("ok", "flock f ex") // control: a lock call on a live hold succeeds
	if err := m.eng.Break(context.Background(), lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}); err != nil {
		t.Fatal(err)
	}
	r := p.do("read f")
	if !strings.HasPrefix(r, `read "you holder token=`) || !strings.Contains(r, ` lost\n`) || !strings.Contains(r, ` lost=\"`) {
		t.Errorf("status of a broken lock through its holder: %s", r)
	}
	p.must("err EIO", "flock f ex")
	p.must("ok", "flock f un") // unlocking still succeeds
	// The lock is free again.
	if !flockNB(t, "-x", m.path("a/.lock")) {
		t.Error("a/.lock still refused after the broken hold was unlocked")
	}
}
