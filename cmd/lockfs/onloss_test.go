package main

import (
	"io"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/lockmgr"
)

func quietLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// waitSignalled waits for cmd to end and returns the signal that ended it.
func waitSignalled(t *testing.T, cmd *exec.Cmd) syscall.Signal {
	t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%q was not signalled", cmd.Args)
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() {
		return 0
	}
	return ws.Signal()
}

func TestLossHandlerSignalsProcessGroup(t *testing.T) {
	// A holder in its own process group with a child: both get the signal.
	cmd := exec.Command("sh", "-c", "sleep 100 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer syscall.Kill(-pid, syscall.SIGKILL)
	lossHandler(syscall.SIGUSR1, quietLogger())(lockmgr.LostHold{
		Lock:   lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir},
		Holder: lockmgr.Holder{Process: lockmgr.ProcID{PID: pid}, Mode: lockmgr.Exclusive},
		Err:    lockmgr.ErrLeaseLost,
	})
	if sig := waitSignalled(t, cmd); sig != syscall.SIGUSR1 {
		t.Errorf("holder ended by %v, want SIGUSR1", sig)
	}
	// The group's other member got it too: the group empties (once the
	// orphaned sleep is reaped by init, which may take a moment).
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(-pid, 0) != syscall.ESRCH {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still has members after the signal", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLossHandlerSparesOwnGroupAndNone(t *testing.T) {
	// A holder in our own process group: only the holder is signalled (the
	// test process survives to check it).
	cmd := exec.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	hold := lockmgr.LostHold{Holder: lockmgr.Holder{Process: lockmgr.ProcID{PID: cmd.Process.Pid}}}

	// Control: "none" sends nothing.
	lossHandler(0, quietLogger())(hold)
	time.Sleep(100 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("--on-lease-loss none: the holder died anyway: %v", err)
	}

	lossHandler(syscall.SIGTERM, quietLogger())(hold)
	if sig := waitSignalled(t, cmd); sig != syscall.SIGTERM {
		t.Errorf("holder ended by %v, want SIGTERM", sig)
	}
}
