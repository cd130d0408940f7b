package localbackend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/lockmgr"
)

// Waiting for a flock without tying up a thread.
//
// A blocking flock(2) cannot be interrupted from Go: the runtime installs its
// signal handlers with SA_RESTART, so the kernel restarts the wait after
// every signal, and a thread blocked there stays blocked until the lock is
// granted, however long that is and whatever the caller's ctx says. Polling
// with LOCK_NB would spin, and would lose to every waiter that blocks in
// the kernel.
//
// flock(2) locks belong to the open file description, not to the process or
// the descriptor number. So the backend lets another process wait for it:
// it runs flock(1) from util-linux as "flock -x 3" (or -s) with its own
// descriptor passed as fd 3. The child's fd 3 is the same open file
// description, so when flock(1) exits 0 the lock is held by the backend's
// descriptor, and it stays held after the child is gone. The child waits in
// the kernel's queue like any other waiter.
//
// On cancellation the child is killed (SIGKILL, which ends a flock(2) wait at
// once) and reaped. It may have been granted the lock just before it died,
// so the backend then unlocks the descriptor explicitly with LOCK_UN before
// closing it: close alone would be enough only if no other process shares
// the description, and a child that another goroutine is forking at that
// moment briefly does.
//
// The child is started in its own process group, so that a terminal's
// Ctrl-C meant for the daemon does not make it fail, and with
// PR_SET_PDEATHSIG, so that it dies with the daemon.

// waitDelay bounds how long Wait waits for flock(1)'s stderr after it was
// killed; it has no children, so this is only a safety net.
const waitDelay = time.Second

// waitFlock blocks until f's open file description holds the flock in mode,
// or ctx ends or the backend closes. On failure the descriptor holds no lock
// and the caller closes it.
func (b *Backend) waitFlock(ctx context.Context, f *os.File, mode lockmgr.Mode, id lockmgr.LockID) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Close interrupts waits too. This starts no goroutine unless the
	// backend closes, and then one that only runs cancel.
	stop := context.AfterFunc(b.closeCtx, cancel)
	defer stop()

	flag := "-s"
	if mode == lockmgr.Exclusive {
		flag = "-x"
	}
	cmd := exec.CommandContext(ctx, b.flockPath, flag, "3")
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env = []string{"LC_ALL=C"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = waitDelay
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	log := b.log.WithField("lock", id.String()).WithField("mode", mode.String())
	log.Debug("lock busy, waiting through flock(1)")
	// The child is this backend's own waiter, not one outside it
	// (contend.go).
	runErr := cmd.Start()
	if runErr == nil {
		pid := cmd.Process.Pid
		b.ownWaiter(pid, true)
		runErr = cmd.Wait()
		b.ownWaiter(pid, false)
	}

	if err := ctx.Err(); err != nil || runErr != nil {
		// The child is reaped; undo a grant it may have got just before
		// it was killed.
		fdDo(f, func(fd int) error { return b.flockNB(fd, unix.LOCK_UN) })
		if b.closeCtx.Err() != nil {
			return errBackendClosed
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("waiting with %s %s 3: %w: %s", b.flockPath, flag, runErr, strings.TrimSpace(stderr.String()))
	}
	// Re-asserting the mode we hold is a no-op in the kernel; it checks
	// that the child really locked our description.
	how, _ := flockOp(mode) // mode was checked by Claim
	if err := fdDo(f, func(fd int) error { return b.flockNB(fd, how) }); err != nil {
		fdDo(f, func(fd int) error { return b.flockNB(fd, unix.LOCK_UN) })
		return fmt.Errorf("%s reported the lock taken, but our descriptor does not hold it: %w", b.flockPath, err)
	}
	log.Debug("granted after wait")
	return nil
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
