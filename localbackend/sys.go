package localbackend

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/lockfs/lockfs/internal/backoff"
	"golang.org/x/sys/unix"
)

// Small wrappers over the system calls the backend makes. Every call on a
// lease's descriptor goes through fdDo, so that a concurrent Release or
// Backend.Close can never close the descriptor, and let the number be reused
// for another file, while a call is using it: os.File defers the real
// close(2) until the last such call returns.

// fdDo runs fn with f's descriptor, or fails with os.ErrClosed if f was
// closed.
func fdDo(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// flockNB applies a non-blocking flock(2) operation (how is LOCK_SH, LOCK_EX
// or LOCK_UN; LOCK_NB is added). It never blocks a thread.
func flockNB(fd int, how int) error {
	flockCalls.Add(1)
	return ignoringEINTR(func() error { return unix.Flock(fd, how|unix.LOCK_NB) })
}

// wouldBlock reports whether err is flock(2)'s "lock is held" answer
// (EWOULDBLOCK, which is EAGAIN on Linux).
func wouldBlock(err error) bool {
	return errors.Is(err, unix.EWOULDBLOCK)
}

// ignoringEINTR retries fn while it fails with EINTR.
func ignoringEINTR(fn func() error) error {
	for {
		err := fn()
		if err != syscall.EINTR {
			return err
		}
	}
}

// Polling bounds for an upgrade that has to wait, which may wait on other
// processes' shared holds for long, and for the token lock, which is held for
// a few system calls.
const (
	upgradePollMin = time.Millisecond
	upgradePollMax = 50 * time.Millisecond
	tokenPollMin   = 50 * time.Microsecond
	tokenPollMax   = 5 * time.Millisecond
	// A claim waiting for a yielded file's outside waiters to take it
	// (awaitTurn) polls /proc/locks.
	turnPollMin = 500 * time.Microsecond
	turnPollMax = 5 * time.Millisecond
)

// pollSleep waits bo's next delay (internal/backoff), or until ctx ends or
// the backend closes (errBackendClosed).
func pollSleep(ctx context.Context, bo *backoff.Backoff, closed <-chan struct{}) error {
	err := bo.Sleep(ctx, nil, closed)
	if errors.Is(err, backoff.ErrStopped) {
		return errBackendClosed
	}
	return err
}
