package daemon

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"bazil.org/fuse"

	"github.com/lockfs/lockfs/internal/fusermount"
)

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

// Run serves until a signal arrives on sigs or the mount is unmounted
// from outside, then shuts down: it refuses new locks, unmounts (lazily if
// busy, again on every further signal), waits for Serve to return, and
// releases every lock. A daemon without a mount returns at once with an
// error.
func (d *Daemon) Run(sigs <-chan os.Signal) error {
	if d.served == nil {
		return errNoMount
	}
	select {
	case <-d.served:
		// Someone else unmounted (lockfs unmount, fusermount3 -u).
		d.log.Info("unmounted from outside: releasing every lock and stopping")
		d.Notify("STOPPING=1\nSTATUS=unmounted from outside: releasing every lock")
		d.stopServices()
		return d.finish(d.serveErr)
	case s := <-sigs:
		d.log.WithField("signal", s.String()).Info("stopping: refusing new locks, releasing every lock, unmounting")
		d.Notify("STOPPING=1\nSTATUS=stopping on " + s.String() + ": releasing every lock, unmounting")
	}
	d.stop(sigs)
	return nil
}

// Close stops the daemon as Run does on a signal, for a daemon run in a
// test or the bench: no signal stops it, and the lazy unmount of a busy
// mount is waited for lazyGrace at most. A daemon without a mount closes
// its engine, which releases every lock and closes the backend.
func (d *Daemon) Close() error {
	if d.served == nil {
		return d.engine.Close()
	}
	d.stop(nil)
	return nil
}

// stop refuses new locks, unmounts and releases every lock. Every signal
// on sigs retries the unmount, or exits at once once it went lazy.
func (d *Daemon) stop(sigs <-chan os.Signal) {
	d.stopServices()
	// Refuse new locks and wake every waiter (with ENOLCK), so that waiters
	// let go of their files and the unmount is less likely to be busy.
	engineClosed := make(chan error, 1)
	go func() { engineClosed <- d.engine.Close() }()

	d.awaitUnmount(sigs)
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
}

// awaitUnmount unmounts and waits for Serve to return, for a lazy
// unmount's grace at most; every signal retries a failed unmount, or ends
// the wait after a lazy one.
func (d *Daemon) awaitUnmount(sigs <-chan os.Signal) {
	lazy := d.unmount()
	var grace <-chan time.Time
	if lazy || sigs == nil { // Close: no signal will come to end the wait
		grace = time.After(lazyGrace)
	}
	for {
		select {
		case <-d.served:
			return
		case s := <-sigs:
			if lazy {
				d.log.WithField("signal", s.String()).Warn("signal while files are still open on the detached mount: exiting now")
				return
			}
			d.log.WithField("signal", s.String()).Info("retrying the unmount")
			if lazy = d.unmount(); lazy {
				grace = time.After(lazyGrace)
			}
		case <-grace:
			d.log.Warnf("files are still open on the detached mount after %v: exiting; they get ENOTCONN from now on", lazyGrace)
			return
		}
	}
}

// finish closes everything after the mount went away without a signal.
func (d *Daemon) finish(serveErr error) error {
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
func (d *Daemon) unmount() (lazy bool) {
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
	if err := fusermount.Unmount(d.mountpoint, true); err != nil && !errors.Is(err, fusermount.ErrNotMounted) {
		d.log.WithError(err).Error("lazy unmount failed; send another signal to retry")
		return false
	}
	d.log.Info("mount busy (files or locks open there): detached lazily; waiting for the last files to close")
	return true
}
