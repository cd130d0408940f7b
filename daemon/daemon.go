// Package daemon builds a lockfs daemon from one Config and runs it: the
// backend, the process tree, the protocol engine, the filesystem and its
// mount, the admin socket, the metrics and the watch of long waits. Start
// builds and starts them in that order and undoes what it made when a step
// fails; Run serves until a signal or an external unmount and then stops
// them in the order that lets every lock go (refuse new locks, unmount,
// release, close); Close does the same for an in-process daemon.
//
// "lockfs mount" parses its flags into a Config and maps the errors of
// Start and Run to exit codes; "lockfs lock" without a mount, the bench and
// tests start daemons through this package too. It installs no signal
// handler and never exits the process: its caller owns both.
package daemon

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"bazil.org/fuse"
	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/admin"
	"github.com/lockfs/lockfs/fs"
	"github.com/lockfs/lockfs/internal/logs"
	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/lockmgr"
	"github.com/lockfs/lockfs/metrics"
)

// Daemon is a running daemon: an engine over a backend and, with a
// Mountpoint, a served mount with its services.
type Daemon struct {
	// Dependencies
	log    logrus.FieldLogger
	notify func(string) error

	// Constant data
	mountpoint string
	backend    lockmgr.Backend
	engine     *lockmgr.Engine
	host       string

	// The mount and its services; nil without a Mountpoint.
	fs         *fs.FS
	conn       *fuse.Conn
	served     chan struct{} // closed when Serve returns
	serveErr   error         // Serve's result; read after served is closed
	admin      *admin.Server
	waits      *waitWatch // logs long waits while they last
	adminPath  string
	metricsSrv *http.Server // nil without MetricsAddr
}

// MountError is the failure of the mount system call (fuse.Mount).
type MountError struct {
	Mountpoint string
	Err        error
}

func (e *MountError) Error() string { return fmt.Sprintf("mount %s: %v", e.Mountpoint, e.Err) }
func (e *MountError) Unwrap() error { return e.Err }

// Start builds the daemon cfg describes and starts serving. On error,
// everything it made is undone.
func Start(cfg Config) (_ *Daemon, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := logs.OrDiscard(cfg.Logger)
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	bb, err := newBackend(&cfg, log)
	if err != nil {
		return nil, err
	}
	d := &Daemon{log: log, notify: cfg.Notify, backend: bb.b, host: cfg.Host, mountpoint: cfg.Mountpoint}
	if d.host == "" {
		d.host = bb.hostID
	}
	if d.host == "" {
		d.host, _ = os.Hostname()
	}
	procs := cfg.Processes
	if procs == nil {
		pt, err := procinfo.NewTree(procinfo.TreeConfig{})
		if err != nil {
			bb.b.Close()
			return nil, err
		}
		procs = pt
	}
	ec := lockmgr.Config{Backend: bb.b, Processes: procs, Logger: log, Host: d.host, OnLoss: cfg.OnLoss,
		KeepContended: cfg.KeepContended}
	if cfg.Mountpoint == "" {
		if d.engine, err = lockmgr.New(ec); err != nil {
			bb.b.Close()
			return nil, err
		}
		return d, nil
	}
	m := metrics.New(func() lockmgr.Tally { return d.engine.Tally() }) // d.engine is made below, with m its observer
	if bb.counts != nil {
		m.RegisterBackendRequests(bb.counts)
	}
	ec.Observer = &slowWaits{next: m, threshold: cfg.SlowWait, log: log, host: d.host}
	if d.engine, err = lockmgr.New(ec); err != nil {
		bb.b.Close()
		return nil, err
	}
	undo = append(undo, func() { d.engine.Close() })
	m.RegisterBuildInfo(cfg.Version, cfg.Backend)
	if err := d.mount(&cfg, m, &undo); err != nil {
		return nil, err
	}
	d.log = log.WithField("mountpoint", cfg.Mountpoint)
	if err := d.startServices(&cfg, m); err != nil {
		d.stopServices()
		return nil, err
	}
	go func() {
		defer close(d.served)
		d.serveErr = fs.Serve(d.conn, d.fs)
	}()
	return d, nil
}

// mount makes the filesystem and mounts it, adding to undo what it made.
func (d *Daemon) mount(cfg *Config, m *metrics.Metrics, undo *[]func()) error {
	fc := cfg.FS
	fc.Engine, fc.Logger, fc.Host, fc.ObserveOp, fc.Observer = d.engine, d.log, d.host, m.FUSEOp, m
	f, err := fs.New(fc)
	if err != nil {
		return err
	}
	*undo = append(*undo, func() { f.Close() })
	mopts := fs.MountOptions(fsName(fc.Source), cfg.AllowOther)
	if fc.Passthrough {
		mopts = append(mopts, fs.PassthroughOption(fc.Source))
	}
	if fc.ReadDirPlus {
		mopts = append(mopts, fs.ReadDirPlusOption())
	}
	if fc.SpliceReads {
		mopts = append(mopts, fs.SpliceReadsOption())
	}
	m.RegisterPassthrough(func() bool { on, _ := f.PassthroughState(); return on })
	conn, err := fuse.Mount(cfg.Mountpoint, mopts...)
	if err != nil {
		return &MountError{Mountpoint: cfg.Mountpoint, Err: err}
	}
	*undo = append(*undo, func() { fuse.Unmount(cfg.Mountpoint) })
	d.fs, d.conn, d.served = f, conn, make(chan struct{})
	return nil
}

// Engine is the daemon's lock engine.
func (d *Daemon) Engine() *lockmgr.Engine { return d.engine }

// Backend is the daemon's backend, owned by the daemon.
func (d *Daemon) Backend() lockmgr.Backend { return d.backend }

// Host is the name the daemon goes by in status output.
func (d *Daemon) Host() string { return d.host }

// AdminPath is the path of the admin socket, "" without one.
func (d *Daemon) AdminPath() string { return d.adminPath }

// Notify tells the service manager the daemon's state (Config.Notify); a
// failure is logged, never fatal: the mount works without systemd.
func (d *Daemon) Notify(state string) {
	if d.notify == nil {
		return
	}
	if err := d.notify(state); err != nil {
		d.log.WithError(err).Warn("telling systemd the daemon's state")
	}
}

// fsName is the device name the mount table shows: SOURCE, unless it holds
// characters that the mount option string cannot carry.
func fsName(source string) string {
	if strings.ContainsAny(source, ", \t\n\\") {
		return "lockfs"
	}
	return source
}

// errNoMount is returned by Run of a daemon without a mount.
var errNoMount = errors.New("daemon: no mount to serve")
