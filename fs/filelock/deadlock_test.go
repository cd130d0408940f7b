package filelock_test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/fs/internal/fsmount"
	"github.com/lockfs/lockfs/internal/testutil"
)

// pyCycle locks argv[1] with lockf, prints "held", waits for a line, then
// asks for argv[2] (blocking) and prints "ok" or "errno N", then waits for
// a line before exiting. With a third argument "handover" it lets argv[1]
// go just before it asks for argv[2].
const pyCycle = `
import fcntl, sys
a = open(sys.argv[1], "r+")
fcntl.lockf(a, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
b = open(sys.argv[2], "r+")
if sys.argv[3:] == ["handover"]:
    fcntl.lockf(a, fcntl.LOCK_UN)
try:
    fcntl.lockf(b, fcntl.LOCK_EX)
    print("ok", flush=True)
except OSError as e:
    print("errno %d" % e.errno, flush=True)
sys.stdin.readline()
`

// cycleProc is a pyCycle helper.
type cycleProc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines <-chan string
}

// startRangePair mounts, creates f1 and f2, and starts p1, a pyCycle
// helper holding f1, and p2, one holding f2 (with extra, its further
// arguments); once both hold,
// p1 asks for f2 and is seen waiting for it for 500 ms (long enough for
// its attempts to be 50 ms apart).
func startRangePair(t *testing.T, extra ...string) (p1, p2 *cycleProc) {
	t.Helper()
	m := fsmount.New(t, t.TempDir())
	for _, f := range []string{"f1", "f2"} {
		if err := os.WriteFile(m.Path(f), []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p1 = startCycle(t, m.Path("f1"), m.Path("f2"))
	p2 = startCycle(t, append([]string{m.Path("f2"), m.Path("f1")}, extra...)...)
	for _, p := range []*cycleProc{p1, p2} {
		if l := p.next(20 * time.Second); l != "held" {
			t.Fatalf("helper said %q, want held", l)
		}
	}
	fmt.Fprintln(p1.in, "go")
	if l := p1.next(500 * time.Millisecond); l != "" {
		t.Fatalf("p1 should wait for f2, but said %q", l)
	}
	return p1, p2
}

// startCycle starts pyCycle with args, in a session of its own.
func startCycle(t *testing.T, args ...string) *cycleProc {
	t.Helper()
	testutil.RequireTools(t, "python3")
	cmd := exec.Command("python3", append([]string{"-c", pyCycle}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	c := testutil.StartChild(t, cmd)
	return &cycleProc{cmd: cmd, in: c.Stdin, lines: c.Lines}
}

// next returns the helper's next line, or "" after d.
func (p *cycleProc) next(d time.Duration) string {
	select {
	case l := <-p.lines:
		return l
	case <-time.After(d):
		return ""
	}
}

// TestPTRangeLockCycleIsDeadlock: two processes lock two ordinary files in
// opposite order with F_SETLKW (lockf): the one that closes the cycle gets
// EDEADLK, as on a local file system, and the other is granted once it
// gives up its lock. Before the fix both waited until interrupted (the
// bounded waits below turn that into a failure). Control: the same second
// request without a cycle (the first process's lock gone) waits and is
// granted, not refused.
func TestPTRangeLockCycleIsDeadlock(t *testing.T) {
	p1, p2 := startRangePair(t)
	fmt.Fprintln(p2.in, "go")
	if l := p2.next(20 * time.Second); l != fmt.Sprintf("errno %d", syscall.EDEADLK) {
		t.Fatalf("p2 closing the cycle: got %q, want EDEADLK (errno %d)", l, syscall.EDEADLK)
	}
	// p1 is still waiting, not refused: it gets f2 when p2 exits.
	if l := p1.next(300 * time.Millisecond); l != "" {
		t.Fatalf("p1 (not closing the cycle) said %q while p2 still holds f2", l)
	}
	fmt.Fprintln(p2.in, "exit")
	if l := p1.next(20 * time.Second); l != "ok" {
		t.Fatalf("p1 after p2 gave f2 up: got %q, want ok", l)
	}
	if out := strings.TrimSpace(p2.next(time.Second)); out != "" {
		t.Fatalf("p2 said %q after exiting", out)
	}
}

// TestPTRangeLockHandOverIsNoDeadlock: p1 holds f1 and waits for f2,
// which p2 holds; p2 lets f2 go and at once asks for f1. That is no cycle
// (p1's wait is over: f2 is free), so p2 waits and is granted once p1,
// granted f2, exits; on a local file system the kernel's unlock wakes p1
// and drops its wait. Before the fix p2 got EDEADLK: p1's wait, recorded
// at its last attempt, still stood for f2 until its next one (up to 50 ms
// later). Control: TestPTRangeLockCycleIsDeadlock, the same two processes
// in a true cycle, is refused.
func TestPTRangeLockHandOverIsNoDeadlock(t *testing.T) {
	p1, p2 := startRangePair(t, "handover")
	fmt.Fprintln(p2.in, "go")
	if l := p1.next(20 * time.Second); l != "ok" {
		t.Fatalf("p1 after p2 let f2 go: got %q, want ok", l)
	}
	if l := p2.next(300 * time.Millisecond); l != "" {
		t.Fatalf("p2 should wait for f1 (held by p1), but said %q", l)
	}
	fmt.Fprintln(p1.in, "exit")
	if l := p2.next(20 * time.Second); l != "ok" {
		t.Fatalf("p2 after p1 exited: got %q, want ok", l)
	}
}
