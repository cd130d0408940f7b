package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func TestChildTalksInLines(t *testing.T) {
	RequireTools(t, "sh")
	cmd := exec.Command("sh", "-c", `echo one; read x; echo skipped; echo "got $x"`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	c := StartChild(t, cmd)
	if l := c.Line(DefaultWait); l != "one" {
		t.Fatalf("first line %q, want one", l)
	}
	fmt.Fprintln(c.Stdin, "two")
	c.WaitLine("got two", DefaultWait)
	select {
	case <-c.Done:
	case <-time.After(DefaultWait):
		t.Fatal("the child did not exit")
	}
	if c.Err != nil {
		t.Fatalf("Err %v, want nil", c.Err)
	}
	if _, ok := <-c.Lines; ok {
		t.Fatal("Lines not closed at the end of stdout")
	}
}

// TestChildKillEndsItsGroup: Kill of a child in a session of its own ends
// what the child started too. Control: SIGKILL to the child alone, as Kill
// sends to a child outside a group of its own, leaves its background job
// running (and holding stdout, so the child is reaped only once that ends).
func TestChildKillEndsItsGroup(t *testing.T) {
	RequireTools(t, "sh", "sleep")
	for _, own := range []bool{true, false} {
		cmd := exec.Command("sh", "-c", `sleep 1000 & echo $!; wait`)
		if own {
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		}
		c := StartChild(t, cmd)
		bg, err := strconv.Atoi(c.Line(DefaultWait))
		if err != nil {
			t.Fatal(err)
		}
		gone := func() bool { return procGone(bg) }
		if own {
			c.Kill()
			EventuallyWithin(t, DefaultWait, "the background sleep to end with its group", gone)
			continue
		}
		c.Cmd.Process.Kill()
		if Poll(time.Second, gone) {
			t.Errorf("control: the background sleep ended with the child")
		}
		syscall.Kill(bg, syscall.SIGKILL)
		select {
		case <-c.Done:
		case <-time.After(DefaultWait):
			t.Fatal("control: the child was not reaped once its background job ended")
		}
	}
}

// TestChildKillDoesNotWaitForAReader: a child that prints without end,
// whose lines nobody reads, is killed and reaped all the same.
func TestChildKillDoesNotWaitForAReader(t *testing.T) {
	RequireTools(t, "yes")
	cmd := exec.Command("yes")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	c := StartChild(t, cmd)
	EventuallyWithin(t, DefaultWait, "the line buffer to fill", func() bool { return len(c.Lines) == cap(c.Lines) })
	c.Kill()
	select {
	case <-c.Done:
	default:
		t.Fatal("Kill returned before the child was reaped")
	}
}

// procGone reports whether pid no longer runs (gone, or a zombie).
func procGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	for i := len(b) - 1; i > 0; i-- {
		if b[i] == ')' {
			return i+2 < len(b) && b[i+2] == 'Z'
		}
	}
	return false
}
