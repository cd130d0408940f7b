package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lockfs/lockfs/admin"
	"github.com/lockfs/lockfs/daemon"
	"github.com/lockfs/lockfs/fs"
	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/internal/fusermount"
	"github.com/lockfs/lockfs/localbackend"
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
	fs.IntVar(&mf.maxOpen, "max-open-per-uid", -1, "descriptors of the daemon one user may hold through the mount: open directories, open files without FUSE passthrough, locks of files (EMFILE beyond; -1: seven eighths of the daemon's descriptor limit, a quarter with --allow-other; 0: no cap)")
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
	stopLimit := make(chan struct{})
	limitDone := trackMemoryLimit(stopLimit)
	defer func() { close(stopLimit); <-limitDone }()
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

	d, maxOpen, err := startDaemon(paths, mf, lossSig, log)
	if err != nil {
		return err
	}
	tuneReadahead(paths.mountpoint, mf.readaheadKB, log)
	log.WithFields(logrus.Fields{"version": Version(), "on_lease_loss": signalName(lossSig), "admin_socket": d.AdminPath()}).
		Infof("mounted %s at %s (backend %s)", paths.source, paths.mountpoint, describeBackend(mf, d.Host()))
	log.WithFields(settingsInEffect(mf, d.Backend(), maxOpen)).Info("settings in effect")
	// The mount answers from here on: units ordered after a Type=notify
	// lockfs@.service start now, not before the mountpoint exists.
	d.Notify("READY=1\nSTATUS=serving " + paths.source + " at " + paths.mountpoint)
	return d.Run(sigs)
}

// startDaemon starts the daemon the flags describe (package daemon).
// It returns the open-file cap in force, for the start-up log.
func startDaemon(paths mountPaths, mf mountFlags, lossSig syscall.Signal, log *logrus.Logger) (*daemon.Daemon, int, error) {
	cfg, err := daemonConfig(mf, paths.source, log)
	if err != nil {
		return nil, 0, err
	}
	cfg.Mountpoint = paths.mountpoint
	cfg.KeepContended = keepContended(log)
	cfg.Notify = sdNotify
	cfg.OnLoss = lossHandler(lossSig, controlPath(paths.mountpoint), log)
	cfg.SlowWait = mf.slowWait
	cfg.AdminDir = mf.adminDir
	cfg.MetricsAddr = mf.metricsAddr
	cfg.Version = Version()
	cfg.AllowOther = mf.allowOther
	keepCache := os.Getenv(keepCacheEnv) == "1"
	if keepCache {
		log.Warnf("%s=1: the kernel's cache is kept whatever changes in SOURCE; data written there or through another mount can be read stale and lost (for tests only)", keepCacheEnv)
	}
	cfg.FS = fs.Config{Source: paths.source, ListControlFiles: mf.listCtl, KeepCacheUnsafe: keepCache,
		MaxOpenPerUID: maxOpenPerUID(mf.maxOpen, raiseNofile(log), mf.allowOther),
		Passthrough:   mf.passthrough == "auto", ReadDirPlus: mf.readdirplus == "on", SpliceReads: mf.spliceReads == "on"}
	d, err := daemon.Start(cfg)
	var me *daemon.MountError
	if errors.As(err, &me) {
		return nil, 0, fmt.Errorf("%w%s", err, mountHint(me.Err))
	}
	return d, cfg.FS.MaxOpenPerUID, err
}

// daemonConfig is the daemon's backend and engine as the flags choose
// them; the engine's hooks and the mount's fields are left to the caller.
// log is the daemon's, nil to discard.
func daemonConfig(mf mountFlags, source string, log logrus.FieldLogger) (daemon.Config, error) {
	keep := mf.keepShared
	switch {
	case keep < 0:
		return daemon.Config{}, fmt.Errorf("--keep-shared-locks %v: must not be negative (0 turns the keep off)", keep)
	case keep == 0:
		keep = -1 // off
	}
	return daemon.Config{
		Logger:           log,
		Backend:          mf.backend,
		Local:            localbackend.Config{Source: source, AllowNetworkFS: mf.allowRemote, KeepShared: keep},
		GCS:              mf.gcs.config(nil),
		Etcd:             mf.etcd.config(mf.gcs, nil),
		EtcdPasswordFile: mf.etcd.passwordFile,
	}, nil
}

// mountHint adds advice to a mount error whose cause is a common setup issue.
func mountHint(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "executable file not found"), strings.Contains(msg, "fusermount3: not found"):
		return ": " + fusermount.InstallHint
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
