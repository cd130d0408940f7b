package daemon

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/fs"
	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// Backend kinds, the values of Config.Backend.
const (
	Local = "local"
	GCS   = "gcs"
	Etcd  = "etcd"
)

// Backends are the backend kinds a daemon builds.
var Backends = []string{Local, GCS, Etcd}

// Config is everything a daemon is built from. The zero value of an
// optional field means its default, as each field says.
type Config struct {
	// Dependencies

	// Logger receives the daemon's lines; nil discards.
	Logger logrus.FieldLogger
	// Notify, if set, tells the service manager the daemon's state
	// ("READY=1", "STOPPING=1", "STATUS=..."); its errors are logged.
	Notify func(state string) error

	// The backend

	// Backend is the kind of backend to build: Local, GCS or Etcd, with
	// the configuration of the same name below. Ignored when Use is set.
	Backend string
	// Local configures the local backend; its Source defaults to
	// FS.Source and its Logger to Logger.
	Local localbackend.Config
	// GCS configures the gcs backend; its Logger defaults to Logger. Start
	// checks the bucket (gcsbackend.Backend.Check) before it goes on.
	GCS gcsbackend.Config
	// Etcd configures the etcd backend; its Logger defaults to Logger.
	// Start checks the cluster (etcdbackend.Backend.Check).
	Etcd etcdbackend.Config
	// EtcdPasswordFile, if set, is read when the backend is built: its
	// first line is Etcd.Password.
	EtcdPasswordFile string
	// Use is a backend the caller built (a fake, or one whose requests it
	// counts); the daemon owns it from Start on and closes it. Nil: build
	// the one Backend names.
	Use lockmgr.Backend

	// The engine

	// Processes resolves thread ids to processes. Nil: /proc
	// (procinfo.NewTree).
	Processes lockmgr.ProcessTree
	// Host names this daemon in status output. Default: the backend's
	// host id (gcs, etcd), else the hostname.
	Host string
	// OnLoss, if set, is called for every hold marked lost
	// (lockmgr.Config.OnLoss).
	OnLoss func(lockmgr.LostHold)
	// KeepContended is lockmgr.Config.KeepContended: the control of the
	// fairness tests, never for use.
	KeepContended bool
	// SlowWait: waits longer than this are logged when they pass it, every
	// minute while they last, and at the grant. 0: never. Mounts only.
	SlowWait time.Duration

	// The filesystem

	// Mountpoint is where to mount FS.Source. Empty: no filesystem, no
	// admin socket and no metrics; the daemon is its engine and backend
	// (the engine serves this process only, as "lockfs lock" without a
	// mount does).
	Mountpoint string
	// FS configures the filesystem. Start fills in its Engine, Logger,
	// Host, ObserveOp and Observer; Passthrough, ReadDirPlus and
	// SpliceReads also choose the mount options that go with them.
	FS fs.Config
	// AllowOther lets users other than the one mounting use the mount.
	AllowOther bool

	// Services, mounts only

	// AdminDir is the directory of the admin socket (admin.SocketPath).
	// Empty: no admin socket.
	AdminDir string
	// Version is lockfs's version, for the build-info metric.
	Version string
	// MetricsAddr, if set, is the HOST:PORT where /metrics is served.
	MetricsAddr string
}

// Validate checks the rules between fields; each backend's own
// configuration is checked by its constructor.
func (c *Config) Validate() error {
	if c.Use == nil && !contains(Backends, c.Backend) {
		return fmt.Errorf("daemon: backend %q: valid values are %v", c.Backend, Backends)
	}
	if c.Mountpoint == "" {
		return nil
	}
	if !filepath.IsAbs(c.FS.Source) || !filepath.IsAbs(c.Mountpoint) {
		return fmt.Errorf("daemon: FS.Source %q and Mountpoint %q must be absolute paths", c.FS.Source, c.Mountpoint)
	}
	if c.FS.MaxOpenPerUID < 0 {
		return errors.New("daemon: FS.MaxOpenPerUID must not be negative (0: no cap)")
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
