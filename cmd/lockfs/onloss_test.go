package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

func quietLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// startCaller starts a script in a process group of its own that runs a
// holder: a child shell with FILE open on descriptor 8 and a sleep of its
// own, like `flock dir/.lock cmd` in a script. When the holder ends, the
// script prints "survived" and lives on. It returns the script, as a
// testutil.Child whose cleanup kills the group, and the holder's pid once
// the holder's child runs.
func startCaller(t *testing.T, file string) (*testutil.Child, int) {
	t.Helper()
	cmd := exec.Command("sh", "-c", `sh -c 'exec 8<"$FILE"; sleep 100 & wait'; echo survived; exec sleep 100`)
	cmd.Env = append(os.Environ(), "FILE="+file)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	caller := testutil.StartChild(t, cmd)
	var holder int
	testutil.Eventually(t, "the holder and its child run", func() bool {
		kids := procinfo.Children("", cmd.Process.Pid)
		if len(kids) != 1 {
			return false
		}
		holder = kids[0]
		ok, _ := procinfo.HasOpen("", holder, file)
		return ok && len(procinfo.Children("", holder)) == 1
	})
	return caller, holder
}

// TestLossHandlerSignalsHolderAndDescendants: the holder and its child get
// the signal, the script that ran the holder does not. Control: the script
// shares the holder's process group, so the group signal lockfs sent before
// would have ended it (it never printed "survived" then).
func TestLossHandlerSignalsHolderAndDescendants(t *testing.T) {
	file := filepath.Join(t.TempDir(), ".lock")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	caller, holder := startCaller(t, file)
	if g1, _ := unix.Getpgid(caller.Cmd.Process.Pid); g1 != caller.Cmd.Process.Pid {
		t.Fatalf("the script is not its group's leader")
	} else if g2, _ := unix.Getpgid(holder); g2 != g1 {
		t.Fatalf("the holder is not in the script's process group (%d, %d): no control", g2, g1)
	}
	sleeper := procinfo.Children("", holder)[0]
	id := lockmgr.LockID{Path: ".", Kind: lockmgr.KindDir}
	hold := func(pid int) lockmgr.LostHold {
		return lockmgr.LostHold{Lock: id, Holder: lockmgr.Holder{Process: lockmgr.ProcID{PID: pid}, Mode: lockmgr.Exclusive}, Err: lockmgr.ErrLeaseLost}
	}
	at := func(lockmgr.LockID) string { return file }

	// The script holds no descriptor of the lock: naming it as the holder
	// (as the engine does once the process that took a lock died) signals
	// nobody; nor does --on-lease-loss none. Had either signalled the
	// script, it would not print "survived" below: kill(2) has made the
	// signal pending by the time it returns.
	lossHandler(syscall.SIGTERM, at, quietLogger())(hold(caller.Cmd.Process.Pid))
	lossHandler(0, at, quietLogger())(hold(holder))

	lossHandler(syscall.SIGUSR1, at, quietLogger())(hold(holder))
	if line := caller.Line(time.Minute); line != "survived" {
		t.Fatalf("the script after its holder was signalled: %q; want \"survived\"", line)
	}
	testutil.Eventually(t, "the holder's child is gone", func() bool { return syscall.Kill(sleeper, 0) == syscall.ESRCH || procStateZ(sleeper) })
}

// procStateZ reports whether pid is a zombie.
func procStateZ(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] == 'Z'
}

func TestDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 100 & sleep 100 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }()
	pid := cmd.Process.Pid
	testutil.Eventually(t, "two children", func() bool { return len(procinfo.Children("", pid)) == 2 })
	if got := descendants(pid, 0); len(got) != 3 || got[0] != pid {
		t.Errorf("descendants = %v, want the shell and its two sleeps", got)
	}
	kid := procinfo.Children("", pid)[0]
	if got := descendants(pid, kid); len(got) != 2 {
		t.Errorf("descendants skipping %d = %v, want two", kid, got)
	}
}
