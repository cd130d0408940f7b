package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/procinfo"
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
// holding the lost lock and to that process's descendants, so that a
// command run under flock(1) stops instead of running on unprotected
// (SPEC §5). It never signals a process group: for `flock dir/.lock cmd`
// in a script, the group is the whole script, which must survive and see
// flock fail. The holder is signalled only if it has a descriptor of the
// lock's control file open (controlPath gives the file's path as /proc
// shows it): after the process that took a lock died, the engine may name
// its parent as the holder, which did not ask for the lock and is never
// signalled. lockfs itself is never signalled.
func lossHandler(sig syscall.Signal, controlPath func(lockmgr.LockID) string, log logrus.FieldLogger) func(lockmgr.LostHold) {
	self := os.Getpid()
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
		if pid <= 1 || pid == self {
			log.Warn("lock lost; its holder is unknown: nobody signalled")
			return
		}
		holds, err := procinfo.HasOpen("", pid, controlPath(l.Lock))
		switch {
		case err != nil && !procinfo.ThreadOf("", l.Holder.TID, pid):
			log.WithField("error_proc", err.Error()).Warn("lock lost; its holder is gone, or its descriptors cannot be read and it is not the process that took the lock: nobody signalled")
			return
		case err == nil && !holds:
			log.Warn("lock lost; the process it belongs to has no descriptor of the lock (the one that took it died): nobody signalled")
			return
		}
		targets := descendants(pid, self)
		var failed []string
		for _, p := range targets {
			if err := unix.Kill(p, sig); err != nil && !errors.Is(err, unix.ESRCH) {
				failed = append(failed, fmt.Sprintf("%d: %v", p, err))
			}
		}
		if len(failed) > 0 {
			log.WithField("pids", targets).Errorf("lock lost; signalling the holder and its descendants failed for %s", strings.Join(failed, ", "))
			return
		}
		log.WithField("pids", targets).Warn("lock lost: signalled the holder and its descendants")
	}
}

// descendants returns pid followed by its descendants, parents before
// children, leaving out skip and everything below it. A process forked
// after the walk is not included.
func descendants(pid, skip int) []int {
	out := []int{pid}
	seen := map[int]bool{pid: true}
	for i := 0; i < len(out); i++ {
		for _, c := range procinfo.Children("", out[i]) {
			if c != skip && !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	return out
}

// controlPath returns the function that names a lock's control file under
// mountpoint, as /proc/PID/fd shows a descriptor of it.
func controlPath(mountpoint string) func(lockmgr.LockID) string {
	return func(id lockmgr.LockID) string {
		return filepath.Join(mountpoint, id.String())
	}
}
