package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lockfs/lockfs/lockmgr"
)

// Exit codes of "lockfs lock" (SPEC §6a). They follow flock(1) of
// util-linux 2.38: COMMAND's own status when it ran (128+N when a signal N
// ended it), 1 when the lock could not be had in time, 64 (EX_USAGE) for a
// bad command line, 66 (EX_NOINPUT) for a TARGET that cannot be used, as
// flock(1) exits for a lock file it cannot open; and two of lockfs's own.
// Where flock(1) exits 69 for a COMMAND it cannot run, lockfs lock exits
// 126 or 127 as sh(1), env(1) and timeout(1) do (and as flock -c does): 69
// is the lock that could not be taken, which a script must tell apart.
const (
	lockExitConflict    = 1   // -n found the lock held, or -w timed out (unless -E)
	lockExitNoInput     = 66  // EX_NOINPUT: TARGET does not exist or is no lockfs directory
	lockExitUnavailable = 69  // EX_UNAVAILABLE: the lock could not be taken for another reason
	lockExitLost        = 75  // EX_TEMPFAIL: the lock was lost while COMMAND ran
	lockExitNotExec     = 126 // COMMAND could not be run (as sh(1))
	lockExitNotFound    = 127 // COMMAND was not found (as sh(1))
)

// targetError is a TARGET that cannot be used: lockfs lock exits
// lockExitNoInput.
type targetError struct{ err error }

func (e *targetError) Error() string { return e.err.Error() }
func (e *targetError) Unwrap() error { return e.err }

func targetErrorf(format string, args ...any) error {
	return &targetError{err: fmt.Errorf(format, args...)}
}

const lockLong = `Take a lock, run COMMAND while holding it, release it when COMMAND ends,
and exit with COMMAND's status, like flock(1).

TARGET is one of:
  DIR                      a directory inside a lockfs mount: the lock is taken
                           through its control file (DIR/.lock for --kind dir),
                           whatever backend the mount uses; or that control
                           file itself, as flock(1) takes it (DIR/.lock,
                           DIR/.lock_newdir, DIR/.lock_usage: the kind is
                           the file's);
  --source SOURCE DIR      no mount: the local backend in this process, on the
                           ..LOCK files of SOURCE, so the lock excludes and is
                           excluded by every mount over SOURCE and by programs
                           that flock SOURCE/DIR/..LOCK; DIR is relative to
                           SOURCE (or an absolute path inside it);
  --backend gcs --gcs-bucket B [--gcs-prefix P] DIR
                           no mount: the gcs backend in this process, in the
                           namespace of the hosts that mount bucket B, prefix P;
                           DIR is relative to the namespace's root;
  --backend etcd --etcd-endpoints URL,... [--etcd-prefix P] DIR
                           no mount: the etcd backend in this process, in the
                           namespace of the hosts that mount that cluster and
                           prefix; DIR is relative to the namespace's root.

COMMAND may also be given as -c 'command line' (before or right after
TARGET), run with sh -c. Flags end at TARGET: what follows is COMMAND's.

flock(1)'s spellings work: -e for -x, --nb for --nonblock, --wait for
--timeout, and -w 0 fails at once like -n. -o (--close) is what lockfs lock
always does: COMMAND never inherits the lock's descriptor, so a daemon that
COMMAND leaves behind does not keep the lock. -u (--unlock) has no meaning
here: flock -u unlocks a descriptor that a shell holds, and lockfs lock
holds none for the shell; its lock ends when COMMAND ends.

COMMAND runs in its own process group with stdin, stdout and stderr passed
through and LOCKFS_TOKEN (the grant's fencing token) and LOCKFS_LOCK (the
lock: the control file's path through a mount, else the lock as the
namespace names it, e.g. a/b/.lock) in its environment. SIGINT, SIGTERM and
SIGHUP sent to lockfs lock are forwarded to COMMAND's process group.

If the lock is lost while COMMAND runs (a lease lost, lockfs break, the
mount gone), COMMAND's process group gets SIGTERM, then SIGKILL after
--kill-after; lockfs lock says so on stderr and exits 75. The caller is never
signalled. If lockfs lock itself is killed, COMMAND gets SIGTERM from the
kernel (PR_SET_PDEATHSIG) as the lock goes with lockfs lock.

Exit status: COMMAND's (128+N if signal N ended it); 1 if -n found the lock
held or -w ran out (CODE with -E); 64 for a bad command line; 66 if TARGET
does not exist or is not in a lockfs mount (or DIR not in SOURCE); 69 if the
lock could not be taken for another reason (backend unreachable, deadlock,
permission, no fencing token could be issued); 75 if the lock was lost while
COMMAND ran; 126 or 127 if COMMAND could not be run or was not found.`

const lockExample = `  lockfs lock /mnt/projects/alpha -- make deploy              # exclusive
  lockfs lock -s -w 30 /mnt/projects/alpha -- make check      # shared, wait 30 s at most
  lockfs lock -n /mnt/projects/alpha -c 'echo got it'         # fail at once if held
  lockfs lock /mnt/projects/alpha/.lock_newdir -- mkdir new   # the kind from the control file
  lockfs lock --source /srv/projects alpha -- ./deploy.sh     # no mount
  lockfs lock --backend gcs --gcs-bucket acme-locks alpha -- ./deploy.sh
  lockfs lock --backend etcd --etcd-endpoints http://etcd-1:2379 alpha -- ./deploy.sh`

// lockFlags are the flags of "lockfs lock".
type lockFlags struct {
	shared, exclusive bool
	nonblock          bool
	wait              time.Duration
	waitSet           bool // -w was given: -w 0 is -n, as in flock(1)
	conflictCode      int
	kind              string
	kindSet           bool // --kind was given
	closeFD           bool // -o: always so (see lockLong)
	unlock            bool // -u: refused (see lockLong)
	verbose           bool
	killAfter         time.Duration
	shellCommand      string
	source            string
	backend           string
	gcs               gcsFlags
	etcd              etcdFlags
}

func newLockCmd() *cobra.Command {
	var lf lockFlags
	cmd := &cobra.Command{
		Use:     "lock [flags] TARGET [--] COMMAND [ARGS...]",
		Short:   "Run a command under a lock, through a mount or with no mount",
		Long:    lockLong,
		Example: lockExample,
		RunE: func(cmd *cobra.Command, args []string) error {
			lf.waitSet = cmd.Flags().Changed("timeout")
			lf.kindSet = cmd.Flags().Changed("kind")
			return runLock(cmd, lf, args)
		},
	}
	fs := cmd.Flags()
	// Flags end at TARGET, as flock(1)'s do: what follows is COMMAND's.
	fs.SetInterspersed(false)
	// flock(1)'s other long spellings of the same flags.
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		switch name {
		case "wait":
			name = "timeout"
		case "nb":
			name = "nonblock"
		}
		return pflag.NormalizedName(name)
	})
	fs.BoolVarP(&lf.shared, "shared", "s", false, "take the lock shared")
	fs.BoolVarP(&lf.exclusive, "exclusive", "x", false, "take the lock exclusive (the default; also -e)")
	fs.BoolVarP(&lf.exclusive, "exclusive-e", "e", false, "flock(1)'s -e: -x")
	_ = fs.MarkHidden("exclusive-e")
	fs.BoolVarP(&lf.nonblock, "nonblock", "n", false, "fail (exit 1) rather than wait if the lock is held (also --nb)")
	durationVarP(fs, &lf.wait, "timeout", "w", 0, "fail (exit 1) if the lock is not had within SECONDS (30, 1.5 or 2m; 0: at once, as -n; also --wait); without -w: wait for ever")
	fs.BoolVarP(&lf.closeFD, "close", "o", false, "COMMAND does not inherit the lock's descriptor: always so, accepted for flock(1)'s sake")
	fs.BoolVarP(&lf.unlock, "unlock", "u", false, "refused: flock(1)'s -u unlocks a shell's descriptor; lockfs lock's lock ends with COMMAND")
	fs.IntVarP(&lf.conflictCode, "conflict-exit-code", "E", lockExitConflict, "exit status when -n or -w fails")
	fs.StringVar(&lf.kind, "kind", "dir", "which lock of the directory: dir (.lock), newdir (.lock_newdir) or usage (.lock_usage, exclusive only)")
	fs.BoolVarP(&lf.verbose, "verbose", "v", false, "while waiting, say on stderr what for and who holds the lock (after 1 s, then every 10 s)")
	durationVarP(fs, &lf.killAfter, "kill-after", "", 10*time.Second, "after a lost lock's SIGTERM, SIGKILL COMMAND's process group this much later")
	fs.StringVarP(&lf.shellCommand, "command", "c", "", "run this command line with sh -c instead of COMMAND")
	fs.StringVar(&lf.source, "source", "", "no mount: lock in the local backend's files of this SOURCE directory")
	fs.StringVar(&lf.backend, "backend", "", "no mount: gcs, with --gcs-bucket, or etcd, with --etcd-endpoints")
	fs.StringVar(&lf.gcs.bucket, "gcs-bucket", "", "gcs: the bucket holding the lock leases")
	fs.StringVar(&lf.gcs.prefix, "gcs-prefix", "", "gcs: object name prefix of the namespace")
	fs.StringVar(&lf.gcs.endpoint, "gcs-endpoint", "", "gcs: a GCS emulator's JSON API URL (turns authentication off)")
	durationVarP(fs, &lf.gcs.ttl, "lease-ttl", "", 30*time.Second, "gcs: lease time to live, at least 100ms; the lock is lost if lockfs lock cannot refresh it for this long")
	fs.StringVar(&lf.gcs.hostID, "host-id", "", "gcs: this process's host name in the bucket (default: hostname plus a random suffix)")
	fs.Var(&lf.gcs.lockDelay, "lock-delay", lockDelayUsage)
	lf.etcd.register(fs, "etcd")
	completeValues(cmd, "kind", kinds...)
	completeValues(cmd, "backend", lockBackends...)
	return cmd
}

// heldLock is a lock taken for COMMAND.
type heldLock interface {
	// token is the grant's fencing token.
	token() uint64
	// lost is closed when the lock is lost.
	lost() <-chan struct{}
	// lostErr says why, once lost is closed.
	lostErr() error
	// check looks whether the lock is still held now (lost is closed if not).
	check()
	// release gives the lock up and stops what watched it.
	release() error
}

// locker takes one lock.
type locker interface {
	// acquire takes the lock in mode, waiting until ctx ends if wait. A lock
	// held by someone else gives an error wrapping lockmgr.ErrWouldBlock;
	// the end of ctx gives ctx.Err().
	acquire(ctx context.Context, mode lockmgr.Mode, wait bool) (heldLock, error)
	// holders describes who holds the lock now, for -v; "" if nobody is known.
	holders() string
	// name is the lock as LOCKFS_LOCK and messages name it.
	name() string
	// close undoes what the locker set up (after release).
	close() error
}

// newLocker builds the locker for TARGET and the backend flags.
func newLocker(lf lockFlags, r lockRequest) (locker, error) {
	switch {
	case lf.backend != "":
		return newEngineLocker(mountFlags{backend: lf.backend, gcs: lf.gcs, etcd: lf.etcd}, "", r.target, r.kind)
	case lf.source != "":
		return newEngineLocker(mountFlags{backend: "local"}, lf.source, r.target, r.kind)
	default:
		return newMountLocker(r.target, r.kind)
	}
}

func runLock(cmd *cobra.Command, lf lockFlags, args []string) error {
	stderr := cmd.ErrOrStderr()
	r, err := parseLockArgs(lf, args)
	if err != nil {
		return err
	}
	// Signals from here on: while waiting they end the wait, while COMMAND
	// runs they are forwarded to it.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	l, err := newLocker(lf, r)
	if err != nil {
		code := lockExitUnavailable
		var te *targetError
		if errors.As(err, &te) {
			code = lockExitNoInput
		}
		return &exitCodeError{code: code, msg: "lockfs lock: " + err.Error()}
	}
	h, err := acquireLock(l, lf, r, sigs, stderr)
	if err != nil {
		l.close()
		return err
	}
	code := runUnderLock(h, l.name(), r.command, lf.killAfter, sigs, stderr)
	if err := h.release(); err != nil {
		fmt.Fprintf(stderr, "lockfs lock: releasing %s: %v\n", l.name(), err)
	}
	if err := l.close(); err != nil {
		fmt.Fprintf(stderr, "lockfs lock: %v\n", err)
	}
	if code == exitOK {
		return nil
	}
	return &exitCodeError{code: code}
}

// acquireLock takes the lock as the flags say: at once with -n, within -w,
// or waiting; a signal meanwhile ends the wait. With -v it reports the wait.
func acquireLock(l locker, lf lockFlags, r lockRequest, sigs <-chan os.Signal, stderr io.Writer) (heldLock, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if r.wait > 0 && !r.nonblock {
		var c context.CancelFunc
		ctx, c = context.WithTimeout(ctx, r.wait)
		defer c()
	}
	type result struct {
		h   heldLock
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := l.acquire(ctx, r.mode, !r.nonblock)
		done <- result{h, err}
	}()
	var report <-chan time.Time
	if lf.verbose && !r.nonblock {
		t := time.NewTimer(time.Second)
		defer t.Stop()
		report = t.C
	}
	start := time.Now()
	var res result
	var sig os.Signal
wait:
	for {
		select {
		case res = <-done:
			break wait
		case sig = <-sigs:
			cancel()
			res = waitAcquire(done)
			break wait
		case <-report:
			msg := fmt.Sprintf("lockfs lock: waiting %v for %s %s", time.Since(start).Round(time.Second), r.mode, l.name())
			if who := l.holders(); who != "" {
				msg += ": " + who
			}
			fmt.Fprintln(stderr, msg)
			report = time.After(10 * time.Second)
		}
	}
	switch err := res.err; {
	case err == nil && sig == nil:
		return res.h, nil
	case err == nil:
		// Granted as the signal came: give it back.
		res.h.release()
		fallthrough
	case sig != nil:
		return nil, &exitCodeError{code: 128 + int(sig.(syscall.Signal)),
			msg: fmt.Sprintf("lockfs lock: %v while waiting for %s", sig, l.name())}
	case errors.Is(err, lockmgr.ErrWouldBlock):
		return nil, &exitCodeError{code: lf.conflictCode}
	case errors.Is(err, context.DeadlineExceeded):
		return nil, &exitCodeError{code: lf.conflictCode,
			msg: fmt.Sprintf("lockfs lock: %s still held after %v", l.name(), r.wait)}
	default:
		return nil, &exitCodeError{code: lockExitUnavailable, msg: fmt.Sprintf("lockfs lock: %v", err)}
	}
}

// abandonWait bounds how long a cancelled acquire may take to return. A
// wait through a mount blocks in flock(2), which Go cannot interrupt: it
// ends when this process exits (the kernel then interrupts the request), so
// lockfs lock exits instead of waiting for it.
const abandonWait = 2 * time.Second

// waitAcquire waits for a cancelled acquire to return, at most abandonWait.
func waitAcquire[T any](done <-chan T) T {
	select {
	case r := <-done:
		return r
	case <-time.After(abandonWait):
		var zero T
		return zero
	}
}

// onceLost is the lost channel of a heldLock: closed once, with a reason.
type onceLost struct {
	once sync.Once
	ch   chan struct{}
	mu   sync.Mutex
	err  error // GUARDED_BY(mu)
}

func newOnceLost() *onceLost { return &onceLost{ch: make(chan struct{})} }

func (o *onceLost) lose(err error) {
	o.once.Do(func() {
		o.mu.Lock()
		o.err = err
		o.mu.Unlock()
		close(o.ch)
	})
}

func (o *onceLost) lost() <-chan struct{} { return o.ch }

func (o *onceLost) lostErr() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}
