package main

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/lockmgr"
)

// parseSignal parses the --on-lease-loss value: a signal name with or
// without "SIG" (SIGTERM, term, KILL), a number, or "none" (0: no signal).
func parseSignal(s string) (syscall.Signal, error) {
	if strings.EqualFold(s, "none") {
		return 0, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, usagef("--on-lease-loss %q: no such signal", s)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		return 0, usagef("--on-lease-loss %q: want a signal name such as SIGTERM, SIGKILL, SIGUSR1, or none", s)
	}
	return sig, nil
}

// signalName renders sig for logs; 0 is "none".
func signalName(sig syscall.Signal) string {
	if sig == 0 {
		return "none"
	}
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return fmt.Sprintf("signal %d", int(sig))
}

// lossHandler returns the engine's OnLoss hook: it sends sig to the process
// group of the process holding the lost lock, so that a command run under
// flock(1) stops instead of running on unprotected (SPEC §5). If the holder
// is in our own process group (lockfs started from the same script), only
// the holder itself is signalled: lockfs must not signal itself.
func lossHandler(sig syscall.Signal, log logrus.FieldLogger) func(lockmgr.LostHold) {
	self := unix.Getpgrp()
	return func(l lockmgr.LostHold) {
		pid := l.Holder.Process.PID
		fields := logrus.Fields{
			"path": l.Lock.String(), "mode": l.Holder.Mode.String(), "pid": pid,
			"uid": l.Holder.UID, "token": l.Holder.Token, "signal": signalName(sig),
		}
		log := log.WithFields(fields).WithError(l.Err)
		if sig == 0 {
			log.Warn("lock lost; --on-lease-loss is none: the holder is not signalled")
			return
		}
		if pid <= 1 {
			log.Warn("lock lost; its holder is unknown: nobody signalled")
			return
		}
		pgid, err := unix.Getpgid(pid)
		if err != nil {
			log.WithField("error_getpgid", err.Error()).Warn("lock lost; its holder is gone: nobody signalled")
			return
		}
		target, desc := -pgid, "process group"
		if pgid == self || pgid <= 1 {
			target, desc = pid, "process (it shares lockfs's process group)"
		}
		if err := unix.Kill(target, sig); err != nil {
			log.WithField("pgid", pgid).Errorf("lock lost; signalling the holder's %s failed: %v", desc, err)
			return
		}
		log.WithField("pgid", pgid).Warnf("lock lost: signalled the holder's %s", desc)
	}
}
