package localbackend

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/logs"
	"github.com/lockfs/lockfs/lockmgr"
)

// Compile-time checks.
var (
	_ lockmgr.Backend        = (*Backend)(nil)
	_ lockmgr.Lease          = (*lease)(nil)
	_ lockmgr.ContendedLease = (*lease)(nil)
)

// errBackendClosed is returned by calls made after (or interrupted by) Close.
var errBackendClosed = fmt.Errorf("local backend: %w", lockmgr.ErrClosed)

// Backend is the local lockmgr.Backend: claims are kernel flocks on hidden
// files in SOURCE. It is safe for concurrent use.
//
// LOCK ORDERING: Backend.mu before lease.mu. Neither is held across a system
// call that can block or across a wait.
type Backend struct {
	// Constant data
	log       logrus.FieldLogger
	flockPath string
	syncToken bool
	src       *os.File // O_PATH|O_DIRECTORY descriptor of SOURCE; see fdDo
	// keepFor is how long a released shared claim keeps its flock
	// (keep.go); 0 disables the keep (tests' control).
	keepFor time.Duration

	// closeCtx is cancelled when Close begins, to interrupt waits.
	closeCtx    context.Context
	closeCancel context.CancelFunc

	// Mutable state
	mu sync.Mutex
	// closed is set once Close began. GUARDED_BY(mu)
	closed bool
	// leases are the claims held and not yet released. GUARDED_BY(mu)
	leases map[*lease]struct{}
	// idle are released claims' unlocked descriptors, kept briefly for
	// reuse (idle.go). GUARDED_BY(mu)
	idle idleSet
	// idleSweep closes expired idle descriptors; nil while none is
	// pending. GUARDED_BY(mu)
	idleSweep *time.Timer
	// kept are released shared claims still holding LOCK_SH, by backing
	// file (keep.go). GUARDED_BY(mu)
	kept map[string]*keptFile
	// keepSweep unlocks expired kept claims; nil while none is pending.
	// GUARDED_BY(mu)
	keepSweep *time.Timer
	// contention watches /proc/locks for waiters outside this backend
	// (contend.go). GUARDED_BY(mu)
	contention contention
	// inflight counts calls in progress, the sweeps and the contention
	// poller. Add only under mu while !closed.
	inflight sync.WaitGroup
	// flockCalls counts the flock(2) calls made through flockNB, for
	// tests.
	flockCalls atomic.Uint64
}

// New opens SOURCE and returns a backend over it. It fails if cfg is
// invalid, if flock(1) cannot be found, if the kernel lacks openat2(2)
// (Linux 5.6), or if SOURCE is on a network or FUSE filesystem and
// cfg.AllowNetworkFS is not set.
func New(cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := logs.OrDiscard(cfg.Logger)
	flockPath := cfg.FlockPath
	if flockPath == "" {
		p, err := exec.LookPath("flock")
		if err != nil {
			return nil, fmt.Errorf("localbackend: flock(1) from util-linux is needed to wait for locks: %w", err)
		}
		flockPath = p
	}
	fd, err := unix.Open(cfg.Source, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("localbackend: open source %q: %w", cfg.Source, err)
	}
	if err := checkSource(fd, cfg); err != nil {
		unix.Close(fd)
		return nil, err
	}
	keep := cfg.KeepShared
	switch {
	case keep == 0:
		keep = DefaultKeepShared
	case keep < 0:
		keep = 0
	}
	closeCtx, closeCancel := context.WithCancel(context.Background())
	return &Backend{
		log:         log.WithFields(logrus.Fields{"backend": "local", "source": cfg.Source}),
		flockPath:   flockPath,
		syncToken:   cfg.SyncTokens,
		keepFor:     keep,
		src:         os.NewFile(uintptr(fd), cfg.Source),
		closeCtx:    closeCtx,
		closeCancel: closeCancel,
		leases:      make(map[*lease]struct{}),
		idle:        idleSet{reuse: idleReuse},
	}, nil
}

// foreignFS are the filesystems whose flock(2) is not (only) this host's
// kernel lock table, by statfs magic.
var foreignFS = map[int64]string{
	unix.NFS_SUPER_MAGIC:   "nfs",
	unix.SMB_SUPER_MAGIC:   "smb",
	unix.SMB2_SUPER_MAGIC:  "smb2",
	unix.CIFS_SUPER_MAGIC:  "cifs",
	unix.FUSE_SUPER_MAGIC:  "fuse",
	unix.V9FS_MAGIC:        "9p",
	unix.CEPH_SUPER_MAGIC:  "ceph",
	unix.AFS_SUPER_MAGIC:   "afs",
	unix.AFS_FS_MAGIC:      "afs",
	unix.CODA_SUPER_MAGIC:  "coda",
	unix.NCP_SUPER_MAGIC:   "ncp",
	unix.OCFS2_SUPER_MAGIC: "ocfs2",
}

// ForeignFilesystem names the filesystem that path is on if its flock(2)
// is not (only) this host's kernel lock table ("nfs", "cifs", "fuse",
// "9p"...), or returns "" for a local one. New refuses such a Source
// unless Config.AllowNetworkFS is set; callers use this to explain it first.
func ForeignFilesystem(path string) (string, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		return "", fmt.Errorf("statfs %q: %w", path, err)
	}
	return foreignFS[int64(sfs.Type)], nil
}

// checkSource probes openat2 and the filesystem type of SOURCE.
func checkSource(fd int, cfg Config) error {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveSafely}
	pfd, err := openat2(fd, ".", &how)
	if err != nil {
		return fmt.Errorf("localbackend: openat2(2) on %q: %w (Linux 5.6 or later is required)", cfg.Source, err)
	}
	unix.Close(pfd)
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return fmt.Errorf("localbackend: statfs %q: %w", cfg.Source, err)
	}
	if name, ok := foreignFS[int64(sfs.Type)]; ok && !cfg.AllowNetworkFS {
		return fmt.Errorf("localbackend: source %q is on %s, whose flock is not this host's lock table; "+
			"use the gcs backend, or allow it explicitly if every lockfs daemon runs on this host", cfg.Source, name)
	}
	return nil
}

// enter registers a call in progress, or fails once Close has begun. The
// caller must call b.inflight.Done when it returns.
func (b *Backend) enter() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errBackendClosed
	}
	b.inflight.Add(1)
	return nil
}

// Close makes every later call fail with lockmgr.ErrClosed, interrupts the
// calls still waiting, waits for them to return, releases every claim still
// held and closes SOURCE. It returns nil, and nil again if called twice.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	if b.idleSweep != nil {
		b.idleSweep.Stop()
		b.idleSweep = nil
	}
	if b.keepSweep != nil {
		b.keepSweep.Stop()
		b.keepSweep = nil
	}
	b.mu.Unlock()

	b.closeCancel()
	b.inflight.Wait()

	b.mu.Lock()
	leases := make([]*lease, 0, len(b.leases))
	for l := range b.leases {
		leases = append(leases, l)
	}
	clear(b.leases)
	idle := b.idle.drain()
	for _, k := range b.kept {
		idle = append(idle, k.file) // closing releases the flock
	}
	clear(b.kept)
	b.mu.Unlock()
	closeAll(idle)

	for _, l := range leases {
		b.log.WithField("lock", l.id.String()).WithField("mode", l.Mode().String()).
			Info("releasing claim still held at close")
		l.closeFile()
	}
	return b.src.Close()
}

// forget drops a released lease from the set Close releases.
func (b *Backend) forget(l *lease) {
	b.mu.Lock()
	delete(b.leases, l)
	b.mu.Unlock()
}

// SourceNames returns the backing file names, which the mount must hide and
// refuse to create (lockmgr.SourceNamer).
func (b *Backend) SourceNames() []string {
	return []string{dirLockName, newDirLockName, usageLockName}
}

// Blocker says who a request waiting for a claim waits for
// (lockmgr.BlockerDescriber): whoever holds the backing file's flock.
func (b *Backend) Blocker() string {
	return "another process or daemon on this host (backing file)"
}
