package testutil

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Child is a helper process a test talks to in lines: a pipe to its stdin,
// and its stdout read line by line. StartChild starts one; the test's
// cleanup kills it and reaps it.
type Child struct {
	t     testing.TB
	Cmd   *exec.Cmd
	Stdin io.WriteCloser
	// Lines carries stdout, line by line, and is closed at its end. Lines
	// nobody receives wait in a buffer (64), then hold the child up until
	// the test ends; they are dropped from the moment Kill begins.
	Lines <-chan string
	// Done is closed once the process has been reaped; Err, Wait's
	// result, is set before.
	Done <-chan struct{}
	Err  error

	stop     chan struct{}
	stopOnce sync.Once
}

// StartChild starts cmd with a pipe to its stdin and one from its stdout;
// cmd's Stderr, if unset, is the test binary's. Test helpers run in a
// session of their own (cmd.SysProcAttr Setsid), so that no signal meant
// for them or their group reaches the test runner: StartChild does not
// set it. t's cleanup calls Kill.
func StartChild(t testing.TB, cmd *exec.Cmd) *Child {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %q: %v", cmd.Args, err)
	}
	lines, done := make(chan string, 64), make(chan struct{})
	c := &Child{t: t, Cmd: cmd, Stdin: stdin, Lines: lines, Done: done, stop: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-c.stop:
			}
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout) // past a line too long for the scanner
		c.Err = cmd.Wait()
		close(done)
	}()
	t.Cleanup(c.Kill)
	return c
}

// Line returns the next line of stdout. It fails the test if stdout ends
// first, or if none comes within d.
func (c *Child) Line(d time.Duration) string {
	c.t.Helper()
	select {
	case l, ok := <-c.Lines:
		if !ok {
			<-c.Done
			c.t.Fatalf("%q exited (%v) before printing a line", c.Cmd.Args, c.Err)
		}
		return l
	case <-time.After(d):
		c.t.Fatalf("%q printed no line within %v", c.Cmd.Args, d)
	}
	return ""
}

// WaitLine reads stdout until a line equal to want. It fails the test if
// stdout ends first, or if want does not come within d.
func (c *Child) WaitLine(want string, d time.Duration) {
	c.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case l, ok := <-c.Lines:
			if !ok {
				<-c.Done
				c.t.Fatalf("%q exited (%v) before printing %q", c.Cmd.Args, c.Err, want)
			}
			if l == want {
				return
			}
		case <-deadline:
			c.t.Fatalf("%q did not print %q within %v", c.Cmd.Args, want, d)
		}
	}
}

// Kill closes stdin, sends SIGKILL to the child's process group if it
// leads one (Setsid, or Setpgid without Pgid: what it started there goes
// too), else to the child, and waits until the child is reaped; a child
// outside a group of its own is reaped only once whatever it started and
// that still holds its stdout has ended too. It may be called more than
// once.
func (c *Child) Kill() {
	c.stopOnce.Do(func() { close(c.stop) })
	_ = c.Stdin.Close()
	if a := c.Cmd.SysProcAttr; a != nil && (a.Setsid || a.Setpgid && a.Pgid == 0) {
		_ = syscall.Kill(-c.Cmd.Process.Pid, syscall.SIGKILL)
	} else {
		_ = c.Cmd.Process.Kill() // an error only once it was reaped
	}
	select {
	case <-c.Done:
	case <-time.After(30 * time.Second):
		c.t.Errorf("%q not reaped 30 s after SIGKILL", c.Cmd.Args)
	}
}
