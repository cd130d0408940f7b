package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"bazil.org/fuse"
	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/fs"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

const mountUsage = `Usage: lockfs mount [flags] SOURCE MOUNTPOINT

Present the directory tree SOURCE at MOUNTPOINT, in the foreground, until
Ctrl-C, SIGTERM or "lockfs unmount MOUNTPOINT". Every directory of the mount
shows the control files .lock, .lock_newdir and .lock_usage; lock them with
flock(1), flock(2) or fcntl(2):

  flock MOUNTPOINT/projects/.lock -c 'make deploy'     # exclusive
  flock -s MOUNTPOINT/projects/.lock -c 'make check'   # shared
  cat MOUNTPOINT/projects/.lock                        # who holds it

SOURCE and MOUNTPOINT must be existing directories, and MOUNTPOINT may not
lie inside SOURCE. A stale mount at MOUNTPOINT (left by a killed daemon) is
cleaned up first. On SIGINT or SIGTERM lockfs refuses new locks, releases
every lock, unmounts (lazily if files are still open there; every further
signal retries) and exits 0.
`

// Shutdown timings.
const (
	// lazyGrace is how long to wait, after a lazy unmount, for the last
	// files open on the mount to be closed before exiting anyway. Exiting
	// closes /dev/fuse, and the kernel then fails what is left with
	// ENOTCONN; every lock has been released by then.
	lazyGrace = 5 * time.Second
	// closeTimeout bounds releasing the locks and closing the backend.
	closeTimeout = 30 * time.Second
)

// backends are the values --backend accepts.
var backends = []string{"local"}

// mountFlags are the flags of "lockfs mount".
type mountFlags struct {
	backend     string
	allowOther  bool
	allowRemote bool
	logLevel    string
	logFormat   string
	onLeaseLoss string
}

func runMount(args []string, stdout, stderr io.Writer) error {
	var mf mountFlags
	c := newCommand("mount", mountUsage)
	c.flags.StringVar(&mf.backend, "backend", "local", "where lock state lives: "+strings.Join(backends, ", "))
	c.flags.BoolVar(&mf.allowOther, "allow-other", false, "let users other than the one mounting use the mount (permissions are still checked)")
	c.flags.BoolVar(&mf.allowRemote, "allow-remote-source", false, "allow a SOURCE on NFS, CIFS/SMB or FUSE, whose flock is not this host's")
	c.flags.StringVar(&mf.logLevel, "log-level", "info", "log level: error, warn, info, debug or trace")
	c.flags.StringVar(&mf.logFormat, "log-format", "text", "log format: text or json")
	c.flags.StringVar(&mf.onLeaseLoss, "on-lease-loss", "SIGTERM", "signal sent to the process group of a holder whose lock is lost, or none")
	pos, err := c.parse(args, stdout)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usagef("want two arguments, SOURCE and MOUNTPOINT; got %d", len(pos))
	}
	if !contains(backends, mf.backend) {
		return usagef("--backend %q: valid values are %s", mf.backend, strings.Join(backends, ", "))
	}
	lossSig, err := parseSignal(mf.onLeaseLoss)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, mf.logLevel, mf.logFormat)
	if err != nil {
		return err
	}
	if err := checkFUSE(); err != nil {
		return err
	}
	paths, err := preparePaths(pos[0], pos[1], mf.allowRemote, log)
	if err != nil {
		return err
	}

	// Signals from here on: a Ctrl-C during startup must still unmount.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	d, err := start(paths, mf, lossSig, log)
	if err != nil {
		return err
	}
	log.WithFields(logrus.Fields{"version": Version(), "on_lease_loss": signalName(lossSig)}).
		Infof("mounted %s at %s (backend %s)", paths.source, paths.mountpoint, mf.backend)
	return d.run(sigs)
}

// daemon is a running mount.
type daemon struct {
	log        logrus.FieldLogger
	mountpoint string
	engine     *lockmgr.Engine
	fs         *fs.FS
	conn       *fuse.Conn
	served     chan struct{} // closed when Serve returns
	serveErr   error         // Serve's result; read after served is closed
}

// start builds the backend, the engine and the filesystem, mounts it and
// starts serving. On error, everything it made is undone.
func start(paths mountPaths, mf mountFlags, lossSig syscall.Signal, log *logrus.Logger) (_ *daemon, err error) {
	host, _ := os.Hostname()
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	backend, err := localbackend.New(localbackend.Config{
		Source:         paths.source,
		Logger:         log,
		AllowNetworkFS: mf.allowRemote,
	})
	if err != nil {
		return nil, err
	}
	procs, err := lockmgr.NewProcTree(lockmgr.ProcTreeConfig{})
	if err != nil {
		backend.Close()
		return nil, err
	}
	engine, err := lockmgr.New(lockmgr.Config{
		Backend:   backend,
		Processes: procs,
		Logger:    log,
		Host:      host,
		OnLoss:    lossHandler(lossSig, log),
	})
	if err != nil {
		backend.Close()
		return nil, err
	}
	undo = append(undo, func() { engine.Close() })
	f, err := fs.New(fs.Config{Source: paths.source, Engine: engine, Logger: log, Host: host})
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { f.Close() })
	conn, err := fuse.Mount(paths.mountpoint, fs.MountOptions(fsName(paths.source), mf.allowOther)...)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w%s", paths.mountpoint, err, mountHint(err))
	}
	d := &daemon{
		log:        log.WithField("mountpoint", paths.mountpoint),
		mountpoint: paths.mountpoint,
		engine:     engine,
		fs:         f,
		conn:       conn,
		served:     make(chan struct{}),
	}
	go func() {
		defer close(d.served)
		d.serveErr = fs.Serve(conn, f)
	}()
	return d, nil
}

// run serves until a signal or an external unmount, then shuts down: it
// refuses new locks, unmounts (lazily if busy, again on every further
// signal), waits for Serve to return, and releases every lock.
func (d *daemon) run(sigs <-chan os.Signal) error {
	select {
	case <-d.served:
		// Someone else unmounted (lockfs unmount, fusermount3 -u).
		d.log.Info("unmounted from outside: releasing every lock and stopping")
		return d.finish(d.serveErr)
	case s := <-sigs:
		d.log.WithField("signal", s.String()).Info("stopping: refusing new locks, releasing every lock, unmounting")
	}

	// Refuse new locks and wake every waiter (with ENOLCK), so that waiters
	// let go of their files and the unmount is less likely to be busy.
	engineClosed := make(chan error, 1)
	go func() { engineClosed <- d.engine.Close() }()

	lazy := d.unmount()
	var grace <-chan time.Time
	if lazy {
		grace = time.After(lazyGrace)
	}
	for waiting := true; waiting; {
		select {
		case <-d.served:
			waiting = false
		case s := <-sigs:
			if lazy {
				d.log.WithField("signal", s.String()).Warn("signal while files are still open on the detached mount: exiting now")
				waiting = false
				break
			}
			d.log.WithField("signal", s.String()).Info("retrying the unmount")
			if lazy = d.unmount(); lazy {
				grace = time.After(lazyGrace)
			}
		case <-grace:
			d.log.Warnf("files are still open on the detached mount after %v: exiting; they get ENOTCONN from now on", lazyGrace)
			waiting = false
		}
	}

	var serveErr error
	select {
	case <-d.served:
		serveErr = d.serveErr
		if err := d.fs.Close(); err != nil {
			d.log.WithError(err).Error("closing the filesystem")
		}
	default:
		// Serve still runs for the files open on the detached mount: the
		// filesystem stays open (closing its descriptors under running
		// handlers could let a reused descriptor number point them outside
		// SOURCE) and goes with the process. The engine is closed below.
	}
	select {
	case err := <-engineClosed:
		if err != nil {
			d.log.WithError(err).Error("releasing locks")
		}
	case <-time.After(closeTimeout):
		d.log.Errorf("releasing locks took longer than %v: exiting anyway (the kernel releases flocks of an exiting process)", closeTimeout)
	}
	if serveErr != nil {
		d.log.WithError(serveErr).Error("serving the mount failed")
	}
	d.log.Info("stopped")
	return nil
}

// finish closes everything after the mount went away without a signal.
func (d *daemon) finish(serveErr error) error {
	if err := d.fs.Close(); err != nil {
		d.log.WithError(err).Error("closing the filesystem")
	}
	if err := d.engine.Close(); err != nil {
		d.log.WithError(err).Error("releasing locks")
	}
	if serveErr != nil {
		return fmt.Errorf("serving %s: %w", d.mountpoint, serveErr)
	}
	d.log.Info("stopped")
	return nil
}

// unmount unmounts the mountpoint, lazily if it is busy, and reports whether
// it had to be lazy. A failure is logged; the next signal retries.
func (d *daemon) unmount() (lazy bool) {
	err := fuse.Unmount(d.mountpoint)
	if err == nil {
		d.log.Info("unmounted")
		return false
	}
	if !strings.Contains(err.Error(), "busy") {
		select {
		case <-d.served:
			return false // it was unmounted meanwhile
		default:
		}
		d.log.WithError(err).Error("unmount failed; send another signal to retry, or run `lockfs unmount`")
		return false
	}
	if err := fusermount(d.mountpoint, true); err != nil && !errors.Is(err, errNotMounted) {
		d.log.WithError(err).Error("lazy unmount failed; send another signal to retry")
		return false
	}
	d.log.Info("mount busy (files or locks open there): detached lazily; waiting for the last files to close")
	return true
}

// fsName is the device name the mount table shows: SOURCE, unless it holds
// characters that the mount option string cannot carry.
func fsName(source string) string {
	if strings.ContainsAny(source, ", \t\n\\") {
		return "lockfs"
	}
	return source
}

// mountHint adds advice to a mount error whose cause is a common setup issue.
func mountHint(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "executable file not found"), strings.Contains(msg, "fusermount3: not found"):
		return ": " + installFUSE
	case strings.Contains(msg, "allow_other") || strings.Contains(msg, "user_allow_other"):
		return ": --allow-other needs `user_allow_other` in /etc/fuse.conf when not mounting as root"
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
