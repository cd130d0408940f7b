package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// runUnderLock runs command while h is held and returns the exit status
// lockfs lock exits with (see the lockExit constants).
//
// COMMAND runs in its own process group, so that a lost lock's signals
// reach it and its children but never the caller, and with the kernel's
// parent-death signal set to SIGTERM: if lockfs lock is killed, the lock
// goes with it (its descriptor, or its backend's claims and lease
// refreshes) and COMMAND is told at once. The kernel sends that signal
// when the thread that forked COMMAND ends, so the fork happens on a
// goroutine locked to its thread until COMMAND has been reaped.
//
// When stdin is the terminal and lockfs lock is in its foreground process
// group, COMMAND's group becomes the foreground group while it runs (as a
// shell does for a job), so that COMMAND can read the terminal and Ctrl-C
// reaches it; the terminal is handed back afterwards.
func runUnderLock(h heldLock, lockName string, command []string, killAfter time.Duration, sigs <-chan os.Signal, stderr io.Writer) int {
	path, err := exec.LookPath(command[0])
	if err != nil {
		fmt.Fprintf(stderr, "lockfs lock: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return lockExitNotFound
		}
		return lockExitNotExec
	}
	cmd, tty := commandUnderLock(path, command, h.token(), lockName)
	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		fmt.Fprintf(stderr, "lockfs lock: %v\n", err)
		return lockExitNotExec
	}
	if tty >= 0 {
		defer takeTerminal(tty)
	}
	pgid := cmd.Process.Pid

	var lost bool
	var kill <-chan time.Time
	lose := func() {
		if lost {
			return
		}
		lost = true
		fmt.Fprintf(stderr, "lockfs lock: lock %s lost (%v): sending SIGTERM to COMMAND (process group %d), SIGKILL in %v\n",
			lockName, h.lostErr(), pgid, killAfter)
		_ = unix.Kill(-pgid, unix.SIGTERM)
		kill = time.After(killAfter)
	}
	for {
		select {
		case err := <-exited:
			// Through a mount, the mount's loss signal reaches COMMAND
			// as well as lockfs lock, and COMMAND may end before the
			// signal to lockfs lock is seen: look once more.
			h.check()
			select {
			case <-h.lost():
				if !lost {
					fmt.Fprintf(stderr, "lockfs lock: lock %s lost (%v) by the time COMMAND ended\n", lockName, h.lostErr())
				}
				return lockExitLost
			default:
			}
			return exitStatus(err)
		case s := <-sigs:
			// The mount signals a lost lock's holder, and lockfs lock is
			// that holder: tell a loss from a signal to forward.
			h.check()
			select {
			case <-h.lost():
				lose()
				continue
			default:
			}
			_ = unix.Kill(-pgid, s.(syscall.Signal))
		case <-h.lost():
			lose()
		case <-kill:
			fmt.Fprintf(stderr, "lockfs lock: COMMAND still runs %v after SIGTERM: sending SIGKILL to process group %d\n", killAfter, pgid)
			_ = unix.Kill(-pgid, unix.SIGKILL)
			kill = nil
		}
	}
}

// commandUnderLock is COMMAND (found at path) with lockfs lock's stdio,
// LOCKFS_TOKEN and LOCKFS_LOCK, in a process group of its own that is the
// terminal's foreground group if lockfs lock's is (tty, else -1).
func commandUnderLock(path string, command []string, token uint64, lockName string) (cmd *exec.Cmd, tty int) {
	cmd = exec.Command(path, command[1:]...)
	cmd.Args[0] = command[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "LOCKFS_TOKEN="+strconv.FormatUint(token, 10), "LOCKFS_LOCK="+lockName)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	tty = foregroundTTY()
	if tty >= 0 {
		cmd.SysProcAttr.Foreground = true
		cmd.SysProcAttr.Ctty = tty
	}
	return cmd, tty
}

// exitStatus is the status a shell would report for COMMAND's end.
func exitStatus(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return lockExitNotExec
}

// foregroundTTY returns stdin's descriptor if it is a terminal whose
// foreground process group is ours, else -1.
func foregroundTTY() int {
	pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	if err != nil || pgrp != unix.Getpgrp() {
		return -1
	}
	return 0
}

// takeTerminal makes our process group the terminal's foreground group
// again. Doing so from a background group raises SIGTTOU, ignored
// meanwhile.
func takeTerminal(tty int) {
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	_ = unix.IoctlSetPointerInt(tty, unix.TIOCSPGRP, unix.Getpgrp())
}
