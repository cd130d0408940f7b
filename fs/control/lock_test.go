package control_test

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

	"github.com/lockfs/lockfs/fs/internal/fstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

func TestFlockModes(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a/b", "c")
	fstest.FlockHold(t, m.Path("a/.lock"), "-x")
	if fstest.FlockNB(t, "-x", m.Path("a/.lock")) || fstest.FlockNB(t, "-s", m.Path("a/.lock")) {
		t.Error("a second process took a/.lock while it is held exclusively")
	}
	if fstest.FlockNB(t, "-s", m.Path("a/b/.lock")) {
		t.Error("a/b/.lock was granted under an exclusive a/.lock")
	}
	// Control: an unrelated directory, the root's other kinds, and a
	// different lock kind of a are free.
	if !fstest.FlockNB(t, "-x", m.Path("c/.lock")) || !fstest.FlockNB(t, "-x", m.Path(".lock_newdir")) {
		t.Error("an unrelated lock was refused while a/.lock is held")
	}

	// Shared with shared.
	fstest.FlockHold(t, m.Path("c/.lock"), "-s")
	if !fstest.FlockNB(t, "-s", m.Path("c/.lock")) {
		t.Error("shared refused while only shared is held")
	}
	if fstest.FlockNB(t, "-x", m.Path("c/.lock")) {
		t.Error("exclusive granted while shared is held")
	}
}

func TestFlockWaitTimesOutAndLeavesNothing(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a")
	f := m.Path("a/.lock")
	holder := fstest.FlockHold(t, f, "-x")

	// Control: a blocked waiter shows in the status.
	waiter := fstest.StartPy(t, 0, 0)
	waiter.Must("ok", "open f %s", f)
	waiter.Send("flock f ex")
	testutil.Eventually(t, "the waiter to queue", func() bool { return strings.Contains(m.Status("a/.lock"), "\nwaiters 1\n") })
	waiter.Kill()
	testutil.Eventually(t, "the killed waiter to leave the queue", func() bool {
		return strings.Contains(m.Status("a/.lock"), "\nwaiters 0\n")
	})

	start := time.Now()
	code, out := fstest.RunExit(t, 20*time.Second, "flock", "-w", "1", f, "true")
	if code != 1 {
		t.Fatalf("flock -w 1 on a held lock: exit %d: %s", code, out)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("flock -w 1 took %v", d)
	}
	st := m.Status("a/.lock")
	if !strings.Contains(st, "\nwaiters 0\n") || strings.Count(st, "\nholder ") != 1 {
		t.Errorf("after the timed-out waiter:\n%s", st)
	}
	syscall.Kill(-holder, syscall.SIGKILL)
	testutil.Eventually(t, "the lock to be free", func() bool { return fstest.FlockNB(t, "-x", f) })
	// The probe's own hold goes with its RELEASE, which the kernel sends
	// after its close(2) returns: poll the status.
	if !testutil.Poll(testutil.DefaultWait, func() bool {
		st = m.Status("a/.lock")
		return !strings.Contains(st, "holder") && strings.Contains(st, "\nmode none\n")
	}) {
		t.Errorf("after everyone left:\n%s", st)
	}
}

func TestFlockLineage(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a/b")
	// A child runs under its parent's lock.
	code, out := fstest.RunExit(t, 10*time.Second, "flock", "-x", m.Path("a/.lock"), "-c",
		fmt.Sprintf("flock -x %s true && flock -x %s true", m.Path("a/b/.lock"), m.Path("a/.lock")))
	if code != 0 {
		t.Errorf("nested flock: exit %d: %s", code, out)
	}
	// Control: a stranger waits.
	fstest.FlockHold(t, m.Path("a/.lock"), "-x")
	if fstest.FlockNB(t, "-x", m.Path("a/b/.lock")) {
		t.Error("a stranger took a/b/.lock under another process's exclusive a/.lock")
	}
}

func TestFlockAndLockfExcludeEachOther(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a", "b")
	p := fstest.StartPy(t, 0, 0)
	p.Must("ok", "open f %s", m.Path("a/.lock"))
	p.Must("ok", "lockf f ex")
	if fstest.FlockNB(t, "-x", m.Path("a/.lock")) || fstest.FlockNB(t, "-s", m.Path("a/.lock")) {
		t.Error("flock(1) got a/.lock while python holds it with lockf")
	}
	// Control: another directory is free for flock(1).
	if !fstest.FlockNB(t, "-x", m.Path("b/.lock")) {
		t.Error("flock(1) refused b/.lock")
	}
	p.Must("ok", "lockf f un")
	if !fstest.FlockNB(t, "-x", m.Path("a/.lock")) {
		t.Error("a/.lock still held after lockf unlock")
	}

	// The other way round.
	fstest.FlockHold(t, m.Path("b/.lock"), "-s")
	p.Must("ok", "open g %s", m.Path("b/.lock"))
	p.Must("err EAGAIN", "lockf g ex nb")
	p.Must("ok", "lockf g sh nb") // shared with shared
	p.Must("err EAGAIN", "ofd g ex nb")
	p.Must("err EAGAIN", "flock g ex nb")
}

func TestPOSIXReleasedAtAnyCloseOFDAtLast(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a", "b")
	f := m.Path("a/.lock")

	// POSIX: closing any descriptor of the file drops the process's lock.
	p := fstest.StartPy(t, 0, 0)
	p.Must("ok", "open l %s", f)
	p.Must("ok", "lockf l ex")
	p.Must("ok", "open other %s", f)
	if fstest.FlockNB(t, "-x", f) {
		t.Fatal("lockf lock not held")
	}
	p.Must("ok", "close other")
	testutil.Eventually(t, "the POSIX lock to go at the close of another descriptor", func() bool { return fstest.FlockNB(t, "-x", f) })

	// OFD: closing another descriptor keeps it; the last close drops it.
	g := m.Path("b/.lock")
	p.Must("ok", "open o %s", g)
	p.Must("ok", "ofd o ex")
	p.Must("ok", "open other %s", g)
	p.Must("ok", "close other")
	// Release is asynchronous: wait until the daemon has seen it, so that
	// the check below cannot pass for coming too early.
	testutil.Eventually(t, "the release of the other open file description", func() bool { return m.openHandles("b/.lock") == 1 })
	if fstest.FlockNB(t, "-x", g) {
		t.Fatal("the OFD lock went at the close of another open file description")
	}
	p.Must("ok", "close o")
	testutil.Eventually(t, "the OFD lock to go at its last close", func() bool { return fstest.FlockNB(t, "-x", g) })
}

func TestGetlk(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a", "b")
	holder := fstest.FlockHold(t, m.Path("a/.lock"), "-x")
	p := fstest.StartPy(t, 0, 0)
	p.Must("ok", "open f %s", m.Path("a/.lock"))
	p.Must(fmt.Sprintf("lk ex %d", holder), "getlk f sh")
	// Control: a free lock answers F_UNLCK.
	p.Must("ok", "open g %s", m.Path("b/.lock"))
	p.Must("lk un 0", "getlk g ex")
}

func TestKilledHolderFreesWaiter(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a")
	f := m.Path("a/.lock")
	holder := fstest.StartPy(t, 0, 0)
	holder.Must("ok", "open f %s", f)
	holder.Must("ok", "flock f ex")

	waiter := fstest.StartPy(t, 0, 0)
	waiter.Must("ok", "open f %s", f)
	waiter.Send("flock f ex")
	// Control: the waiter really waits while the holder lives. It is
	// queued in the engine first, so that the check cannot pass for
	// coming before the request arrived.
	testutil.Eventually(t, "the waiter to queue", func() bool { return strings.Contains(m.Status("a/.lock"), "\nwaiters 1\n") })
	if r := waiter.Reply(0); r != "" {
		t.Fatalf("waiter got %q while the lock is held", r)
	}
	holder.Kill()
	if r := waiter.Reply(10 * time.Second); r != "ok" {
		t.Fatalf("waiter after the holder was killed: %q", r)
	}
	if st := m.Status("a/.lock"); !strings.Contains(st, fmt.Sprintf(" pid=%d ", waiter.PID)) {
		t.Errorf("status after handover:\n%s", st)
	}
}

func TestKilledWaitersNeverStick(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a")
	f := m.Path("a/.lock")
	fstest.FlockHold(t, f, "-x")
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
	testutil.Eventually(t, "no waiters left", func() bool { return strings.Contains(m.Status("a/.lock"), "\nwaiters 0\n") })
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
	m.Mkdir("a")
	counter := filepath.Join(t.TempDir(), "counter")
	run := func(lock bool) int {
		if err := os.WriteFile(counter, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		step := fmt.Sprintf(`v=$(cat %s); sleep 0.005; echo $((v+1)) > %s`, counter, counter)
		if lock {
			step = fmt.Sprintf(`flock -x %s -c '%s'`, m.Path("a/.lock"), step)
		}
		script := fmt.Sprintf(`for w in 1 2 3 4; do (for i in $(seq 10); do %s; done) & done; wait`, step)
		if code, out := fstest.RunExit(t, 60*time.Second, "bash", "-c", script); code != 0 {
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
	m.Mkdir("a", "open")
	if err := os.Chmod(filepath.Join(m.Src, "open"), 0o777); err != nil {
		t.Fatal(err)
	}
	p := fstest.StartPy(t, 0, 0)
	p.Must("ok", "open u %s", m.Path("a/.lock_usage"))
	p.Must("err EINVAL", "flock u sh")
	p.Must("err EINVAL", "lockf u sh")
	p.Must("ok", "flock u ex")
	// SPEC §2.4: holding a usage lock, no new lock.
	p.Must("ok", "open n %s", m.Path("a/.lock_newdir"))
	p.Must("err EDEADLK", "flock n sh nb")
	p.Must("ok", "flock u un")
	p.Must("ok", "flock n sh nb") // control: allowed once the usage lock is gone

	// Permissions are checked against the directory: a (0755, root) lets
	// nobody read, not write; open (0777) lets it write.
	nobody := fstest.StartPy(t, 65534, 65534)
	nobody.Must("ok", "open d %s", m.Path("a/.lock"))
	nobody.Must("ok", "flock d sh nb")
	nobody.Must("ok", "flock d un")
	nobody.Must("err EACCES", "flock d ex nb")
	nobody.Must("err EACCES", "lockf d ex nb")
	nobody.Must("ok", "open u %s", m.Path("a/.lock_usage"))
	nobody.Must("err EACCES", "flock u ex nb")
	nobody.Must("ok", "open o %s", m.Path("open/.lock"))
	nobody.Must("ok", "flock o ex nb")
}

func TestLeaseLostGivesEIO(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a")
	p := fstest.StartPy(t, 0, 0)
	p.Must("ok", "open f %s", m.Path("a/.lock"))
	p.Must("ok", "flock f ex")
	p.Must("ok", "flock f ex") // control: a lock call on a live hold succeeds
	if err := m.Engine.Break(context.Background(), lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}); err != nil {
		t.Fatal(err)
	}
	r := p.Do("read f")
	if !strings.HasPrefix(r, `read "you holder token=`) || !strings.Contains(r, ` lost\n`) || !strings.Contains(r, ` lost=\"`) {
		t.Errorf("status of a broken lock through its holder: %s", r)
	}
	p.Must("err EIO", "flock f ex")
	p.Must("ok", "flock f un") // unlocking still succeeds
	// The lock is free again.
	if !fstest.FlockNB(t, "-x", m.Path("a/.lock")) {
		t.Error("a/.lock still refused after the broken hold was unlocked")
	}
}
