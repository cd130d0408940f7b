package control

import (
	"context"
	"errors"
	"os"
	"syscall"

	"bazil.org/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/lockmgr"
)

// lockErrno maps an error of a lock call to the errno the caller sees
// (SPEC §3). It is the one place that does.
func lockErrno(err error) syscall.Errno {
	var en fuse.ErrorNumber
	switch {
	case errors.Is(err, lockmgr.ErrWouldBlock):
		return syscall.EAGAIN
	case errors.Is(err, lockmgr.ErrDeadlock):
		return syscall.EDEADLK
	case errors.Is(err, lockmgr.ErrInvalid):
		return syscall.EINVAL
	case errors.Is(err, lockmgr.ErrLeaseLost):
		return syscall.EIO
	case errors.Is(err, lockmgr.ErrUnavailable), errors.Is(err, lockmgr.ErrClosed):
		return syscall.ENOLCK
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return syscall.EINTR
	case errors.Is(err, errPermission):
		return syscall.EACCES
	case errors.Is(err, os.ErrNotExist):
		// The directory is gone (acquire).
		return syscall.ENOENT
	case errors.As(err, &en):
		return syscall.Errno(en.Errno())
	}
	return syscall.EIO
}

// refuse logs a refused or failed lock call, at the level its errno
// deserves, and returns the errno for bazil to answer with. Refusals
// (EWOULDBLOCK, EDEADLK, EACCES, EINVAL...) are logged at info and name the
// holder in the way; at most one line per lock per refusalWindow, the next
// one counting those left out. An interrupted wait (a signal, a flock -w
// timeout, the waiter's death) is routine: debug.
func (c *Files) refuse(call lockCall, err error) error {
	errno := lockErrno(err)
	pid := call.pid
	if pid == 0 {
		pid = call.tid
	}
	fields := logrus.Fields{
		"op":    call.op,
		"path":  lockmgr.QuoteName(call.id.String()),
		"kind":  call.id.Kind.String(),
		"mode":  call.mode.String(),
		"owner": call.owner.String(),
		"pid":   pid,
		"tid":   call.tid,
		"uid":   call.uid,
		"errno": unix.ErrnoName(errno),
	}
	if errno == syscall.EINTR {
		c.log.WithError(err).WithFields(fields).Debug("lock wait interrupted (signal, timeout or the waiter's death)")
		return errno
	}
	ok, suppressed := c.refusals.allow(call.id)
	if !ok {
		return errno
	}
	if suppressed > 0 {
		fields["suppressed"] = suppressed
	}
	if call.op != "unlock" && call.op != "flush" && call.op != "release" && (errno == syscall.EAGAIN || errno == syscall.EDEADLK) {
		fields["blocked_by"] = c.blocker(lockmgr.Request{Lock: call.id, Mode: call.mode, Owner: call.owner, TID: call.tid, UID: call.uid})
	}
	e := c.log.WithError(err).WithFields(fields)
	switch errno {
	case syscall.EIO:
		e.Error("lock request failed")
	case syscall.ENOLCK:
		e.Warn("lock request failed")
	default:
		e.Info("lock request refused")
	}
	return errno
}
