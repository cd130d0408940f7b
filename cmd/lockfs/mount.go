package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"bazil.org/fuse"
	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lockfs/lockfs/admin"
	"github.com/lockfs/lockfs/fs"
	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
	"github.com/lockfs/lockfs/metrics"
)

const mountLong = `Present the directory tree SOURCE at MOUNTPOINT, in the foreground, until
Ctrl-C, SIGTERM or "lockfs unmount MOUNTPOINT". Every directory of the mount
has the control files .lock, .lock_newdir and .lock_usage; lock them with
flock(1), flock(2) or fcntl(2).

SOURCE and MOUNTPOINT must be existing directories, and MOUNTPOINT may not
lie inside SOURCE. A stale mount at MOUNTPOINT (left by a killed daemon) is
cleaned up first. On SIGINT or SIGTERM lockfs refuses new locks, releases
every lock, unmounts (lazily if files are still open there; every further
signal retries) and exits 0.

-o takes the options of an /etc/fstab line of type fuse.lockfs: every flag
below is also an option, spelled with - or _ (-o backend=gcs,gcs_bucket=B,
allow_other); mount(8)'s generic options (rw, _netdev, nofail, x-*...) are
ignored. A flag given on the command line wins over the same option in -o.
Durations are seconds (30) or Go durations (30s, 2m, 1h30m). In -o, separate
etcd endpoints with ; (a comma ends the option).`

const mountExample = `  lockfs mount /srv/projects /mnt/projects
  lockfs mount -o backend=gcs,gcs_bucket=my-locks /srv/projects /mnt/projects
  lockfs mount --backend etcd --etcd-endpoints http://etcd-1:2379,http://etcd-2:2379 /srv/projects /mnt/projects
  flock /mnt/projects/alpha/.lock -c 'make deploy'     # exclusive
  flock -s /mnt/projects/alpha/.lock -c 'make check'   # shared
  cat /mnt/projects/alpha/.lock                        # who holds it`

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

// keepCacheEnv, set to 1 in a daemon's environment, makes it keep the
// kernel's cache of files regardless of SOURCE (fs.Config.KeepCacheUnsafe):
// the control of the coherence tests, never for use.
const keepCacheEnv = "LOCKFS_TEST_KEEP_CACHE"

// keepContendedEnv, set to 1 in the environment of a daemon or of "lockfs
// lock", makes its engine keep handing a lock that another daemon or host
// waits for to local requests (lockmgr.Config.KeepContended): the control
// of the fairness tests, never for use.
const keepContendedEnv = "LOCKFS_TEST_KEEP_CONTENDED"

// keepContended reads keepContendedEnv, warning if it is set.
func keepContended(log logrus.FieldLogger) bool {
	if os.Getenv(keepContendedEnv) != "1" {
		return false
	}
	log.Warnf("%s=1: locks that other daemons or hosts wait for are kept while local requests want them; they may wait for ever (for tests only)", keepContendedEnv)
	return true
}

// mountFlags are the flags of "lockfs mount".
type mountFlags struct {
	backend     string
	allowOther  bool
	allowRemote bool
	logLevel    string
	logFormat   string
	onLeaseLoss string
	metricsAddr string
	adminDir    string
	slowWait    time.Duration
	readaheadKB int
	passthrough string
	readdirplus string
	spliceReads string
	listCtl     bool
	maxOpen     int
	keepShared  time.Duration
	gcs         gcsFlags
	etcd        etcdFlags
}

// addMountFlags declares the flags of "lockfs mount" on fs. Each is also
// a mount option (options.go).
func addMountFlags(fs *pflag.FlagSet, mf *mountFlags) {
	fs.StringVar(&mf.backend, "backend", "local", "where lock state lives: "+strings.Join(backends, ", "))
	fs.BoolVar(&mf.allowOther, "allow-other", false, "let users other than the one mounting use the mount (permissions are still checked)")
	fs.BoolVar(&mf.allowRemote, "allow-remote-source", false, "allow a SOURCE on NFS, CIFS/SMB or FUSE, whose flock is not this host's")
	fs.StringVar(&mf.logLevel, "log-level", "info", "log level: error, warn, info, debug or trace")
	fs.StringVar(&mf.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&mf.onLeaseLoss, "on-lease-loss", "SIGTERM", "signal sent to a holder whose lock is lost or broken and to its descendants (never to its process group), or none")
	fs.StringVar(&mf.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at HOST:PORT/metrics (off when empty)")
	fs.StringVar(&mf.adminDir, "admin-dir", admin.SocketDir, "directory of the admin socket that lockfs status and lockfs break use")
	durationVarP(fs, &mf.slowWait, "log-wait-over", "", time.Second, "log waits longer than this: when they pass it, every minute while they last (naming who is in the way), and at the grant (0: never)")
	fs.IntVar(&mf.readaheadKB, "readahead-kb", defaultReadaheadKB, "kernel readahead of the mount in KiB, for sequential reads (FUSE's default is 128; 0: leave it; needs root)")
	fs.StringVar(&mf.passthrough, "passthrough", "auto", "FUSE passthrough of regular files' reads, writes and mmap: auto (where the kernel and CAP_SYS_ADMIN allow) or off")
	fs.StringVar(&mf.spliceReads, "splice-reads", "on", "reads that reach the daemon (files without passthrough) go from SOURCE's page cache into the reply by splice(2), one copy per byte instead of two: on or off")
	fs.StringVar(&mf.readdirplus, "readdirplus", "on", "directory reads carry every entry's attributes (FUSE READDIRPLUS), so ls -l, du, tar and rsync need no lookup per name: on or off")
	fs.BoolVar(&mf.listCtl, "list-control-files", false, "list .lock, .lock_newdir and .lock_usage in readdir (by default they are found by name only)")
	durationVarP(fs, &mf.keepShared, "keep-shared-locks", "", localbackend.DefaultKeepShared, "local backend: keep a released shared flock (an ancestor's) this long, so the next lock needs no system call; programs locking SOURCE directly wait at most this long for it (0: off; at most 1m)")
	fs.IntVar(&mf.maxOpen, "max-open-per-uid", -1, "files and directories one user may hold open through the mount (EMFILE beyond; -1: a quarter of the daemon's descriptor limit; 0: no cap)")
	fs.StringVar(&mf.gcs.bucket, "gcs-bucket", "", "gcs backend: the bucket holding the lock leases")
	fs.StringVar(&mf.gcs.prefix, "gcs-prefix", "", "gcs backend: object name prefix, so one bucket can hold several namespaces")
	fs.StringVar(&mf.gcs.endpoint, "gcs-endpoint", "", "gcs backend: a GCS emulator's JSON API URL (turns authentication off); empty = real GCS with Application Default Credentials")
	durationVarP(fs, &mf.gcs.ttl, "lease-ttl", "", gcsbackend.DefaultTTL, "gcs backend: lease time to live, at least 100ms: a crashed host's locks are taken over this long after its last heartbeat, which runs every TTL/3; a host that cannot refresh within it marks its locks lost")
	fs.StringVar(&mf.gcs.hostID, "host-id", "", "gcs backend: this host's name in the bucket (default: hostname plus a random suffix)")
	fs.Var(&mf.gcs.lockDelay, "lock-delay", lockDelayUsage)
	mf.etcd.register(fs, "etcd backend")
}

func newMountCmd() *cobra.Command {
	var mf mountFlags
	var opts []string
	cmd := &cobra.Command{
		Use:     "mount [flags] SOURCE MOUNTPOINT",
		Short:   "Present SOURCE at MOUNTPOINT with directory locks, in the foreground",
		Long:    mountLong,
		Example: mountExample,
		Args:    exactArgs(2, "two arguments, SOURCE and MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			flags := cmd.Flags()
			explicit := func(name string) bool { return flags.Changed(name) }
			for _, o := range opts {
				_, logFile, err := parseMountOptions(o, flags, explicit)
				if err != nil {
					return err
				}
				if logFile != "" {
					return usagef("option %s is for the mount helper (%s); lockfs mount logs to stderr", logFileOption, HelperName)
				}
			}
			return runMount(mf, args[0], args[1], cmd.ErrOrStderr())
		},
	}
	addMountFlags(cmd.Flags(), &mf)
	completeMountFlags(cmd)
	cmd.Flags().StringArrayVarP(&opts, "options", "o", nil, "mount options, comma-separated, as in /etc/fstab (opt[,opt=value]...)")
	return cmd
}

func runMount(mf mountFlags, source, mountpoint string, stderr io.Writer) error {
	if !contains(backends, mf.backend) {
		return usagef("--backend %q: valid values are %s", mf.backend, strings.Join(backends, ", "))
	}
	if mf.maxOpen < -1 {
		return usagef("--max-open-per-uid %d: want -1 (automatic), 0 (no cap) or a count", mf.maxOpen)
	}
	if mf.passthrough != "auto" && mf.passthrough != "off" {
		return usagef("--passthrough %q: want auto or off", mf.passthrough)
	}
	if mf.spliceReads != "on" && mf.spliceReads != "off" {
		return usagef("--splice-reads %q: want on or off", mf.spliceReads)
	}
	if mf.readdirplus != "on" && mf.readdirplus != "off" {
		return usagef("--readdirplus %q: want on or off", mf.readdirplus)
	}
	if mf.readaheadKB < 0 {
		return usagef("--readahead-kb %d: want 0 (leave the kernel's) or a size in KiB", mf.readaheadKB)
	}
	if err := mf.gcs.validate(mf.backend); err != nil {
		return err
	}
	if err := mf.etcd.validate(mf.backend, mf.gcs.ttl); err != nil {
		return err
	}
	lossSig, err := parseSignal(mf.onLeaseLoss)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, mf.logLevel, mf.logFormat)
	if err != nil {
		return err
	}
	ballast := newGCBallast()
	defer runtime.KeepAlive(ballast)
	raiseGOMAXPROCS()
	if err := checkFUSE(); err != nil {
		return err
	}
	if err := checkAllowOther(mf.allowOther); err != nil {
		return err
	}
	if err := checkAdminDir(mf.adminDir); err != nil {
		return err
	}
	paths, err := preparePaths(source, mountpoint, mf.allowRemote, log)
	if err != nil {
		return err
	}
	warnNonEmpty(paths.mountpoint, log)

	// Signals from here on: a Ctrl-C during startup must still unmount.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	d, err := start(paths, mf, lossSig, log)
	if err != nil {
		return err
	}
	log.WithFields(logrus.Fields{"version": Version(), "on_lease_loss": signalName(lossSig), "admin_socket": d.adminPath}).
		Infof("mounted %s at %s (backend %s)", paths.source, paths.mountpoint, describeBackend(mf, d.hostID))
	log.WithFields(d.settings).Info("settings in effect")
	// The mount answers from here on: units ordered after a Type=notify
	// lockfs@.service start now, not before the mountpoint exists.
	d.notify("READY=1\nSTATUS=serving " + paths.source + " at " + paths.mountpoint)
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
	admin      *admin.Server
	waits      *waitWatch // logs long waits while they last
	adminPath  string
	metricsSrv *http.Server // nil without --metrics-addr
	hostID     string
	settings   logrus.Fields // the settings in effect, for the start-up log
}

// stopServices closes the admin socket and the metrics endpoint, and stops
// watching long waits.
func (d *daemon) stopServices() {
	if d.waits != nil {
		d.waits.close()
	}
	if d.admin != nil {
		if err := d.admin.Close(); err != nil {
			d.log.WithError(err).Warn("closing the admin socket")
		}
	}
	if d.metricsSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := d.metricsSrv.Shutdown(ctx); err != nil {
			d.log.WithError(err).Warn("stopping the metrics endpoint")
		}
	}
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

	backend, hostID, counts, err := newBackend(mf, paths.source, log)
	if err != nil {
		return nil, err
	}
	if hostID != "" {
		host = hostID
	}
	procs, err := lockmgr.NewProcTree(lockmgr.ProcTreeConfig{})
	if err != nil {
		backend.Close()
		return nil, err
	}
	var m *metrics.Metrics
	var engine *lockmgr.Engine
	m = metrics.New(func() []lockmgr.LockStatus { return engine.Snapshot() })
	if counts != nil {
		m.RegisterBackendRequests(counts)
	}
	engine, err = lockmgr.New(lockmgr.Config{
		Backend:   backend,
		Processes: procs,
		Logger:    log,
		Host:      host,
		OnLoss:    lossHandler(lossSig, controlPath(paths.mountpoint), log),
		Observer:  &slowWaits{next: m, threshold: mf.slowWait, log: log, host: host},

		KeepContended: keepContended(log),
	})
	if err != nil {
		backend.Close()
		return nil, err
	}
	undo = append(undo, func() { engine.Close() })
	m.RegisterBuildInfo(Version(), mf.backend)
	keepCache := os.Getenv(keepCacheEnv) == "1"
	if keepCache {
		log.Warnf("%s=1: the kernel's cache is kept whatever changes in SOURCE; data written there or through another mount can be read stale and lost (for tests only)", keepCacheEnv)
	}
	maxOpen := maxOpenPerUID(mf.maxOpen, raiseNofile(log), mf.allowOther)
	f, err := fs.New(fs.Config{Source: paths.source, Engine: engine, Logger: log, Host: host, ObserveOp: m.FUSEOp,
		ListControlFiles: mf.listCtl, MaxOpenPerUID: maxOpen, Observer: m, KeepCacheUnsafe: keepCache,
		Passthrough: mf.passthrough == "auto", ReadDirPlus: mf.readdirplus == "on", SpliceReads: mf.spliceReads == "on"})
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { f.Close() })
	mopts := fs.MountOptions(fsName(paths.source), mf.allowOther)
	if mf.passthrough == "auto" {
		mopts = append(mopts, fs.PassthroughOption(paths.source))
	}
	if mf.readdirplus == "on" {
		mopts = append(mopts, fs.ReadDirPlusOption())
	}
	if mf.spliceReads == "on" {
		mopts = append(mopts, fs.SpliceReadsOption())
	}
	m.RegisterPassthrough(func() bool { on, _ := f.PassthroughState(); return on })
	conn, err := fuse.Mount(paths.mountpoint, mopts...)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w%s", paths.mountpoint, err, mountHint(err))
	}
	tuneReadahead(paths.mountpoint, mf.readaheadKB, log)
	d := &daemon{
		log:        log.WithField("mountpoint", paths.mountpoint),
		mountpoint: paths.mountpoint,
		engine:     engine,
		fs:         f,
		conn:       conn,
		served:     make(chan struct{}),
		hostID:     host,
		settings:   settingsInEffect(mf, backend, maxOpen),
	}
	undo = append(undo, func() { fuse.Unmount(paths.mountpoint) })
	if err := d.startServices(mf, m, f); err != nil {
		d.stopServices()
		return nil, err
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
		d.notify("STOPPING=1\nSTATUS=unmounted from outside: releasing every lock")
		d.stopServices()
		return d.finish(d.serveErr)
	case s := <-sigs:
		d.log.WithField("signal", s.String()).Info("stopping: refusing new locks, releasing every lock, unmounting")
		d.notify("STOPPING=1\nSTATUS=stopping on " + s.String() + ": releasing every lock, unmounting")
	}

	d.stopServices()
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

// notify tells the service manager about the daemon's state (sd_notify);
// a failure is logged, never fatal: the mount works without systemd.
func (d *daemon) notify(state string) {
	if err := sdNotify(state); err != nil {
		d.log.WithError(err).Warn("telling systemd the daemon's state")
	}
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
