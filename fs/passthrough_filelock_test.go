package fs

import (
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
)

// ptProc is a helper process that took a lock and holds it until stopped.
type ptProc struct {
	cmd   *exec.Cmd
	child *testutil.Child
}

// ptStartPy runs a Python script and waits until it prints "locked".
func ptStartPy(t *testing.T, script string, args ...string) *ptProc {
	t.Helper()
	testutil.RequireTools(t, "python3")
	cmd := exec.Command("python3", append([]string{"-c", script}, args...)...)
	// A session of its own: no signal meant for it reaches the test runner.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	c := testutil.StartChild(t, cmd)
	if s := strings.TrimSpace(c.Line(20 * time.Second)); s != "locked" {
		t.Fatalf("helper said %q, want locked", s)
	}
	return &ptProc{cmd: cmd, child: c}
}

// stop kills the helper and reaps it.
func (p *ptProc) stop() { p.child.Kill() }

// pyHoldLock takes a blocking lock on argv[1] and holds it: argv[2] is
// "w"/"r" (lockf), "ofd-w" (an OFD lock) or "flock-x"; argv[3], if given,
// is a byte range "start:len".
const pyHoldLock = `
import fcntl, os, struct, sys, time
f = open(sys.argv[1], "r+")
start, length = 0, 0
if len(sys.argv) > 3:
    start, length = map(int, sys.argv[3].split(":"))
m = sys.argv[2]
if m == "w":
    fcntl.lockf(f, fcntl.LOCK_EX, length, start)
elif m == "r":
    fcntl.lockf(f, fcntl.LOCK_SH, length, start)
elif m == "ofd-w":
    fcntl.fcntl(f, fcntl.F_OFD_SETLKW, struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, length, 0))
elif m == "flock-x":
    fcntl.flock(f, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
`

// pyGetlk prints the F_GETLK answer for a write lock on argv[1]: "type
// start len pid".
const pyGetlk = `
import fcntl, struct, sys
f = open(sys.argv[1], "r+")
r = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
t, w, s, l, p = struct.unpack("hhqqi", r)
print(t, s, l, p)
`

// flockFreeSoon is a shell command that succeeds if flock -n -x gets path
// within 2 s. A holder's flock ends with the Release of its open file
// description, which the kernel sends after the holder's close(2) or exit
// has completed (asynchronously).
func flockFreeSoon(path string) string {
	return "for i in $(seq 200); do flock -n -x '" + path + "' true && exit 0; sleep 0.01; done; exit 1"
}

// ptSh runs a shell script and returns its exit code and output.
func ptSh(t *testing.T, timeout time.Duration, script string) (int, string) {
	t.Helper()
	cmd := exec.Command("bash", "-c", script)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%q did not finish in %v: %s", script, timeout, out)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatalf("%q: %v", script, err)
	}
	return 0, string(out)
}

func TestPTFileLocksMeetLocksOnSource(t *testing.T) {
	m := newPTMount(t)
	if err := os.WriteFile(m.s("f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ holder, other string }{{m.s("f"), m.m("f")}, {m.m("f"), m.s("f")}} {
		// flock
		p := ptStartPy(t, pyHoldLock, c.holder, "flock-x")
		if code, out := ptSh(t, 10*time.Second, "flock -n -s "+c.other+" true"); code != 1 {
			t.Errorf("flock -n on %s while %s is flocked: exit %d %s", c.other, c.holder, code, out)
		}
		// flock and POSIX locks are independent, as on Linux.
		if out, err := exec.Command("python3", "-c", pyTryLock, c.other, "w").CombinedOutput(); err != nil {
			t.Errorf("lockf while only a flock is held: %v %s", err, out)
		}
		p.stop()
		if code, out := ptSh(t, 10*time.Second, flockFreeSoon(c.other)); code != 0 {
			t.Errorf("flock -n after the holder died: exit %d %s", code, out)
		}
		// POSIX
		p = ptStartPy(t, pyHoldLock, c.holder, "w", "10:5")
		if out, err := exec.Command("python3", "-c", pyTryLock, c.other, "r").CombinedOutput(); err == nil {
			t.Errorf("lockf on %s while %s holds bytes 10..14: granted %s", c.other, c.holder, out)
		}
		// A range that does not overlap is free.
		if code, out := ptSh(t, 10*time.Second, `python3 -c 'import fcntl,sys; f=open(sys.argv[1],"r+"); fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB, 5, 0)' `+c.other); code != 0 {
			t.Errorf("lock of bytes 0..4: exit %d %s", code, out)
		}
		p.stop()
		if out, err := exec.Command("python3", "-c", pyTryLock, c.other, "w").CombinedOutput(); err != nil {
			t.Errorf("lockf after the holder died: %v %s", err, out)
		}
	}
}

func TestPTGetlkNamesTheHolder(t *testing.T) {
	m := newPTMount(t)
	for _, name := range []string{"g", "h"} {
		if err := os.WriteFile(m.s(name), []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	through := ptStartPy(t, pyHoldLock, m.m("g"), "w", "3:4")
	direct := ptStartPy(t, pyHoldLock, m.s("h"), "r")
	for _, c := range []struct {
		file string
		want string
	}{
		{m.m("g"), fmt.Sprintf("%d 3 4 %d", syscall.F_WRLCK, through.cmd.Process.Pid)},
		{m.m("h"), fmt.Sprintf("%d 0 0 %d", syscall.F_RDLCK, direct.cmd.Process.Pid)},
	} {
		out, err := exec.Command("python3", "-c", pyGetlk, c.file).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != c.want {
			t.Errorf("F_GETLK on %s: %q %v, want %q", c.file, out, err, c.want)
		}
	}
	through.stop()
	out, _ := exec.Command("python3", "-c", pyGetlk, m.m("g")).CombinedOutput()
	if want := fmt.Sprintf("%d 0 0 0", syscall.F_UNLCK); strings.TrimSpace(string(out)) != want {
		t.Errorf("F_GETLK after the holder died: %q, want %q", out, want)
	}
}

// TestPTLockReleaseRules checks when the kernel's rules end locks:
// POSIX record locks at any close(2) by the process, OFD and flock locks at
// the last close of the open file description.
func TestPTLockReleaseRules(t *testing.T) {
	m := newPTMount(t)
	if err := os.WriteFile(m.m("f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	const script = `
import fcntl, os, struct, subprocess, sys, time
path = sys.argv[1]
def other_can(kind):
    code = "import fcntl,struct,sys\nf=open(sys.argv[1],'r+')\n"
    if kind == "posix":
        code += "fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB)"
    else:
        code += "fcntl.flock(f, fcntl.LOCK_EX|fcntl.LOCK_NB)"
    return subprocess.run([sys.executable, "-c", code, path], capture_output=True).returncode == 0
out = []
# POSIX: closing another descriptor of the file ends the lock.
a = os.open(path, os.O_RDWR); fcntl.lockf(a, fcntl.LOCK_EX)
out.append(other_can("posix"))
b = os.open(path, os.O_RDONLY); os.close(b)
out.append(other_can("posix"))
os.close(a)
# OFD: a dup closing does not end it; the last close does (the kernel
# tells the daemon asynchronously, after close returns).
a = os.open(path, os.O_RDWR)
fcntl.fcntl(a, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
d = os.dup(a); os.close(d)
b = os.open(path, os.O_RDONLY); os.close(b)
out.append(other_can("posix"))
os.close(a)
out.append(any(other_can("posix") or time.sleep(0.01) for _ in range(100)))
# flock: likewise.
a = os.open(path, os.O_RDWR); fcntl.flock(a, fcntl.LOCK_EX)
d = os.dup(a); os.close(d)
out.append(other_can("flock"))
fcntl.flock(a, fcntl.LOCK_UN)
out.append(other_can("flock"))
os.close(a)
print(" ".join("free" if x else "held" for x in out))
`
	out, err := exec.Command("python3", "-c", script, m.m("f")).CombinedOutput()
	want := "held free held free held free"
	if err != nil || strings.TrimSpace(string(out)) != want {
		t.Errorf("got %q (%v), want %q", out, err, want)
	}
}

func TestPTLockWaitEndsOnSignal(t *testing.T) {
	m := newPTMount(t)
	if err := os.WriteFile(m.m("f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	holder := ptStartPy(t, pyHoldLock, m.m("f"), "flock-x")
	start := time.Now()
	code, out := ptSh(t, 10*time.Second, "flock -w 0.5 -x "+m.m("f")+" true")
	if code != 1 || time.Since(start) > 5*time.Second {
		t.Errorf("flock -w 0.5 on a held file: exit %d after %v: %s", code, time.Since(start), out)
	}
	// A waiter killed while it waits is gone at once, not stuck in D state.
	for _, lock := range []string{"flock -x " + m.m("f") + " true", `python3 -c 'import fcntl,sys; fcntl.lockf(open(sys.argv[1],"r+"), fcntl.LOCK_EX)' ` + m.m("f")} {
		cmd := exec.Command("bash", "-c", "exec "+lock)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("a waiter killed in %q did not die", lock)
		}
	}
	holder.stop()
	if code, out := ptSh(t, 10*time.Second, flockFreeSoon(m.m("f"))); code != 0 {
		t.Errorf("the lock is not free after the holder and the waiters died: %d %s", code, out)
	}
	// A waiter gets the lock when the holder ends.
	holder = ptStartPy(t, pyHoldLock, m.m("f"), "w")
	waiter := exec.Command("python3", "-c", `import fcntl,sys; fcntl.lockf(open(sys.argv[1],"r+"), fcntl.LOCK_EX); print("got")`, m.m("f"))
	res := make(chan string, 1)
	go func() { b, _ := waiter.CombinedOutput(); res <- strings.TrimSpace(string(b)) }()
	time.Sleep(200 * time.Millisecond)
	holder.stop()
	select {
	case s := <-res:
		if s != "got" {
			t.Errorf("waiter said %q", s)
		}
	case <-time.After(10 * time.Second):
		t.Error("the waiter did not get the lock after the holder died")
	}
}

// TestPTSQLiteConcurrentWriters has four sqlite3 processes insert 200 rows
// each into one database on the mount: SQLite's POSIX locks must exclude
// them from each other for the database to stay whole.
func TestPTSQLiteConcurrentWriters(t *testing.T) {
	testutil.RequireTools(t, "sqlite3")
	m := newPTMount(t)
	db := m.m("test.db")
	if code, out := ptSh(t, 30*time.Second, "sqlite3 "+db+" 'CREATE TABLE t(p INTEGER, i INTEGER);'"); code != 0 {
		t.Fatalf("create: %d %s", code, out)
	}
	const procs, rows = 4, 200
	var wg sync.WaitGroup
	errs := make(chan string, procs)
	for p := 0; p < procs; p++ {
		var b strings.Builder
		// A minute, as the integration writers wait: four writers
		// fsyncing every row under -race on two CPUs have been seen to
		// wait out 10 s ("database is locked").
		b.WriteString("PRAGMA busy_timeout=60000;\n")
		for i := 0; i < rows; i++ {
			fmt.Fprintf(&b, "INSERT INTO t VALUES(%d, %d);\n", p, i)
		}
		script := filepath.Join(t.TempDir(), "ins.sql")
		if err := os.WriteFile(script, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := exec.Command("bash", "-c", "sqlite3 -bail "+db+" < "+script).CombinedOutput()
			if err != nil {
				errs <- fmt.Sprintf("writer: %v: %s", err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	_, out := ptSh(t, 30*time.Second, "sqlite3 "+db+" 'PRAGMA integrity_check; SELECT count(*), count(DISTINCT p*1000+i) FROM t;'")
	if got, want := strings.TrimSpace(out), fmt.Sprintf("ok\n%d|%d", procs*rows, procs*rows); got != want {
		t.Errorf("after the writers: %q, want %q", got, want)
	}
}

// TestPTCounterNeedsFlock has 8 processes increment a counter file 25
// times each through the mount: without a lock updates are lost (the
// control, showing the test can fail), with flock on the file none is.
func TestPTCounterNeedsFlock(t *testing.T) {
	m := newPTMount(t)
	const procs, iters = 8, 25
	run := func(locked bool) int {
		c := m.m("counter")
		if err := os.WriteFile(c, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		step := `n=$(cat ` + c + `); sleep 0.005; echo $((n+1)) > ` + c
		if locked {
			step = `flock ` + c + ` -c '` + step + `'`
		}
		loop := fmt.Sprintf("for i in $(seq %d); do %s; done", iters, step)
		var wg sync.WaitGroup
		for p := 0; p < procs; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if code, out := ptSh(t, 120*time.Second, loop); code != 0 {
					t.Errorf("incrementer: exit %d: %s", code, out)
				}
			}()
		}
		wg.Wait()
		b, err := os.ReadFile(m.s("counter"))
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("counter holds %q", b)
		}
		return n
	}
	if n := run(false); n >= procs*iters {
		t.Errorf("without a lock the counter reached %d of %d: the control lost no update", n, procs*iters)
	} else {
		t.Logf("without a lock: %d of %d increments survived", n, procs*iters)
	}
	if n := run(true); n != procs*iters {
		t.Errorf("with flock the counter is %d, want %d", n, procs*iters)
	}
}
