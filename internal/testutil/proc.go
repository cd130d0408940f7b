package testutil

import (
	"os/exec"
	"syscall"
	"testing"
)

// StartInSession starts cmd in a session of its own (the house rule for
// test holders: no signal meant for its group reaches the test runner) and
// registers a cleanup that kills its group and reaps it. It fails t if cmd
// cannot start.
func StartInSession(t testing.TB, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %q: %v", cmd.Args, err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	return cmd
}
