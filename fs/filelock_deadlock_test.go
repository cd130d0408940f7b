package fs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// pyCycle locks argv[1] with lockf, prints "held", waits for a line, then
// asks for argv[2] (blocking) and prints "ok" or "errno N", then waits for
// a line before exiting.
const pyCycle = `
import fcntl, sys
a = open(sys.argv[1], "r+")
fcntl.lockf(a, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
b = open(sys.argv[2], "r+")
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
	lines chan string
}

func startCycle(t *testing.T, first, second string) *cycleProc {
	t.Helper()
	testutil.RequireTools(t, "python3")
	cmd := exec.Command("python3", "-c", pyCycle, first, second)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &cycleProc{cmd: cmd, in: in, lines: make(chan string, 4)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return p
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
	m := newPTMount(t)
	for _, f := range []string{"f1", "f2"} {
		if err := os.WriteFile(m.m(f), []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p1 := startCycle(t, m.m("f1"), m.m("f2"))
	p2 := startCycle(t, m.m("f2"), m.m("f1"))
	for _, p := range []*cycleProc{p1, p2} {
		if l := p.next(20 * time.Second); l != "held" {
			t.Fatalf("helper said %q, want held", l)
		}
	}
	fmt.Fprintln(p1.in, "go")
	if l := p1.next(500 * time.Millisecond); l != "" {
		t.Fatalf("p1 should wait for f2, but said %q", l)
	}
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
