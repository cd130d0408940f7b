package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/fs/control"
	"github.com/lockfs/lockfs/fs/filelock"
	"github.com/lockfs/lockfs/internal/logs"
	"github.com/lockfs/lockfs/lockmgr"
)

// Config is what a mount needs.
type Config struct {
	// Source is the absolute path of the directory tree to pass through.
	Source string
	// Engine arbitrates the directory locks. Required.
	Engine *lockmgr.Engine
	// Logger receives one line per refused request and per error; nil discards.
	Logger logrus.FieldLogger
	// Host names this daemon in status output; default: the hostname.
	Host string
	// ObserveOp, if set, is told how long each FUSE request took to
	// answer, by operation ("lookup", "lockwait"...), for metrics.
	ObserveOp func(op string, took time.Duration)
	// Passthrough lets opens of regular files use FUSE passthrough where
	// the kernel and the daemon's privileges allow (passthrough.go); mount
	// with PassthroughOption too.
	Passthrough bool
	// SpliceReads answers reads of 32 KiB and more that reach the daemon
	// (files without passthrough) by splice(2) from SOURCE's page cache
	// (fuse.ReadSplice): one copy per byte instead of two. Mount with
	// SpliceReadsOption too, which keeps reads within what a pipe holds.
	SpliceReads bool
	// ReadDirPlus answers directory reads with every entry's attributes
	// (FUSE_READDIRPLUS; dir.go), so that walks that stat what they list
	// cost no lookup per name; mount with ReadDirPlusOption too.
	ReadDirPlus bool
	// ListControlFiles makes readdir list the control files of every
	// directory. By default they are found by name only (SPEC §1).
	ListControlFiles bool
	// MaxOpenPerUID caps the files and directories one uid may hold open
	// through the mount (each holds a descriptor of the daemon; fdcap.go).
	// 0: no cap.
	MaxOpenPerUID int
	// Observer, if set, is told about the lock requests refused before they
	// reach the engine (EACCES: no permission on the directory), so that
	// metrics count every refusal; the engine reports the others.
	Observer lockmgr.Observer
	// KeepCacheUnsafe keeps the kernel's cache of every file across opens
	// and lock grants whatever happens in SOURCE: data written there or
	// through another mount may then be read stale and lost. Only the
	// coherence tests set it, as their control.
	KeepCacheUnsafe bool
}

// Reserved names. The control files appear in every directory; the files
// the lock backend keeps in SOURCE (the local backend's ..LOCK files, see
// FS.backing) are never visible through the mount.

// controlKind reports whether name is a control file, and which lock it takes.
func controlKind(name string) (lockmgr.Kind, bool) {
	return lockmgr.ControlKind(name)
}

// isBacking reports whether name is one of the files the lock backend keeps
// in the directories of SOURCE.
func (f *FS) isBacking(name string) bool {
	return f.backing[name]
}

// isReserved reports whether name may not be created, removed or renamed
// through the mount: a control file or a backing file.
func (f *FS) isReserved(name string) bool {
	_, ok := controlKind(name)
	return ok || f.backing[name]
}

// Kernel cache validity (see "# Caching" in doc.go). Variables only so
// that BenchmarkPTStat can compare choices; nothing else changes them.
var (
	// entryValid is how long the kernel may keep a name → node binding
	// without asking again. A binding that went stale in SOURCE is caught
	// earlier: the node answers ESTALE and the kernel looks the name up again.
	entryValid = time.Second
	// dirAttrValid is how long the kernel may keep a directory's
	// attributes. The kernel checks permissions on every path component
	// from these (default_permissions), so 0 would cost a round trip per
	// component of every path.
	dirAttrValid = time.Second
	// fileAttrValid is how long the kernel may keep the attributes of
	// anything else. A change made in SOURCE directly or through another
	// mount shows within it, and at once after an open or a lock grant on
	// the file (cache.go revalidates them there: close-to-open and lock
	// consistency). 0 cost four GETATTRs per create+stat+unlink cycle.
	fileAttrValid = time.Second
)

// FS is one mount: the passthrough of Config.Source and, through
// package control, the control files. It implements bazil's fusefs.FS.
//
// LOCK ORDERING: moveMu is taken before the others (names.go). nodesMu, treeMu, staleMu, node.mu
// and releaseMu are leaves: none is held while taking another, except
// pins.mu → node.mu (pin.go) and pt.mu → node.mu, treeMu (passthrough.go's
// register). None is
// held across a syscall that can block for long (each is held at most
// across a non-blocking fcntl, dup or close), except shmTwin.mu, which is
// held across a pread or pwrite of a shared-memory file and taken before
// none of the others (shm.go). Packages filelock (locks) and control (ctl)
// order their own locks (filelock.Table, control's doc.go) and hold none
// of them while they call back into fs (a filelock.File, a control.Dir).
// No lock is held while the kernel is asked
// to invalidate its cache (cache.go): that can send requests back.
type FS struct {
	// Dependencies
	cfg Config
	log logrus.FieldLogger // never nil

	// Constant data

	// rootFd is an O_PATH|O_DIRECTORY descriptor of Source. Every backing
	// operation starts from it and resolves beneath it (beneath.go).
	rootFd int
	// root is the mount's root directory node.
	root *Dir
	// byHandle opens inodes by file handle, so that passthrough handles
	// need keep no descriptor (detach.go); nil if they must, and
	// noHandles then says why.
	byHandle  *byHandle
	noHandles string
	// asRoot is true when the daemon runs as root: it then gives new files
	// to the uid and gid of the process that created them.
	asRoot bool
	// backing holds the names the lock backend keeps in the directories
	// of SOURCE (lockmgr.Engine.SourceNames), which the mount hides.
	backing map[string]bool
	// ctl is the control-file half of the mount (package control).
	ctl *control.Files
	// interrupts cancels the lock requests the kernel interrupts
	// (interrupt.go).
	interrupts *interruptTracker
	// handles counts open handles per uid (fdcap.go).
	handles *handleCap
	// locks holds the flock(2) and byte-range locks of ordinary files
	// (package filelock; handlelock.go).
	locks *filelock.Table

	// Mutable state

	// closed is set by Close.
	closed atomic.Bool
	// forgotten counts the nodes the kernel forgot (memory.go).
	forgotten atomic.Int64
	// releaseMu guards release.
	releaseMu sync.Mutex
	// release is the scheduled return of memory after a burst of
	// FORGETs (memory.go). GUARDED_BY(releaseMu)
	release *time.Timer
	// server is the bazil server serving the mount, set by Serve: the
	// kernel's caches are invalidated through it (cache.go).
	server atomic.Pointer[fusefs.Server]
	// given counts the answers that gave the kernel a node's attributes
	// or a name for it: each takes the next value (node.givenGen), for
	// the directory lock's revalidation (cache.go).
	given atomic.Uint64

	// nodesMu guards nodes.
	nodesMu sync.Mutex
	// nodes maps a backing inode to the one Node the kernel knows it by,
	// so that hard links are one node and file locks agree. An entry
	// leaves on Forget. GUARDED_BY(nodesMu)
	nodes map[inodeKey]passNode

	// treeMu guards the links (parent directory and name) of every
	// passthrough node.
	treeMu sync.RWMutex
	// moveMu is held for writing by a rename of a directory through the
	// mount, from before its guard (guardTree) until the tree records the
	// move, and for reading by a lock request that looks where its
	// directory is now (Dir.WhereNow): a directory is then either at its
	// old path in SOURCE and in the tree, or at its new one in both.
	// Taken before treeMu and node locks; never held across a wait for a
	// lock or a call that can block for long.
	moveMu sync.RWMutex

	// staleMu guards stale.
	staleMu sync.Mutex
	// stale maps a path to when it was last answered ESTALE (node.go).
	// GUARDED_BY(staleMu)
	stale map[string]time.Time

	// pt is the FUSE passthrough state (passthrough.go); pt.mu is taken
	// before node.mu and treeMu only.
	pt passthrough
	// pins are the directories whose descriptors are kept (pin.go);
	// pins.mu is taken before node.mu.
	pins pinSet
}

var (
	_ fusefs.FS         = (*FS)(nil)
	_ fusefs.FSStatfser = (*FS)(nil)
)

// New opens Source and returns the file system to serve. Close it after
// serving ends.
func New(cfg Config) (*FS, error) {
	if cfg.Source == "" || !filepath.IsAbs(cfg.Source) {
		return nil, fmt.Errorf("lockfs: source %q must be an absolute path", cfg.Source)
	}
	log := logs.OrDiscard(cfg.Logger)
	rootFd, err := unix.Open(cfg.Source, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("lockfs: open source %q: %w", cfg.Source, err)
	}
	var st inodeStat
	if err := fstat(rootFd, &st); err != nil {
		unix.Close(rootFd)
		return nil, fmt.Errorf("lockfs: stat source %q: %w", cfg.Source, err)
	}
	f := &FS{
		cfg:    cfg,
		log:    log,
		rootFd: rootFd,
		asRoot: os.Geteuid() == 0,
		nodes:  make(map[inodeKey]passNode),
		stale:  make(map[string]time.Time),
	}
	if cfg.Passthrough {
		f.byHandle, f.noHandles = newByHandle(cfg.Source, rootFd)
	}
	f.backing = make(map[string]bool)
	if cfg.Engine != nil {
		for _, name := range cfg.Engine.SourceNames() {
			f.backing[name] = true
		}
	}
	f.ctl = control.New(control.Config{Engine: cfg.Engine, Logger: log, Observer: cfg.Observer, AttrValid: dirAttrValid})
	f.interrupts = newInterruptTracker(nil)
	f.handles = newHandleCap(cfg.MaxOpenPerUID)
	f.locks = filelock.New(filelock.Config{TakeFd: f.takeHandle, GiveFd: f.handles.give, Fail: f.fail})
	f.root = &Dir{node: node{fs: f, key: keyOf(&st), ftype: unix.S_IFDIR}}
	f.root.self = f.root
	f.nodes[f.root.key] = f.root
	return f, nil
}

// Root returns the root directory node.
func (f *FS) Root() (fusefs.Node, error) {
	return f.root, nil
}

// Close releases the descriptors the file system holds: SOURCE's and those
// carrying byte-range locks. Call it after Serve has returned. It is safe
// to call more than once.
func (f *FS) Close() error {
	if f.closed.Swap(true) {
		return nil
	}
	f.stopRelease()
	f.locks.Close()
	f.closeOpenHandles()
	f.closePins()
	f.byHandle.close()
	if err := unix.Close(f.rootFd); err != nil {
		return fmt.Errorf("lockfs: close source: %w", err)
	}
	return nil
}

// closeOpenHandles closes the backing descriptors of the handles still
// open when the mount ends. The kernel sends the RELEASE of a file closed
// by a process that just died in the background, and an unmount drops
// the ones not yet sent, so without this a daemon that serves one mount
// after another (the tests, a library user) would keep those descriptors
// for good.
func (f *FS) closeOpenHandles() {
	f.nodesMu.Lock()
	nodes := make([]*node, 0, len(f.nodes))
	for _, pn := range f.nodes {
		nodes = append(nodes, pn.base())
	}
	f.nodesMu.Unlock()
	for _, n := range nodes { // the root is in f.nodes too, for good
		n.mu.Lock()
		open := make([]*openFile, 0, len(n.open))
		for of := range n.open {
			open = append(open, of)
		}
		n.mu.Unlock()
		for _, of := range open {
			n.releaseOpen(of)
		}
	}
}

// Statfs reports the file system that holds SOURCE.
func (f *FS) Statfs(ctx context.Context, req *fuse.StatfsRequest, resp *fuse.StatfsResponse) error {
	var s unix.Statfs_t
	if err := unix.Fstatfs(f.rootFd, &s); err != nil {
		return f.fail("statfs", ".", err)
	}
	resp.Blocks = s.Blocks
	resp.Bfree = s.Bfree
	resp.Bavail = s.Bavail
	resp.Files = s.Files
	resp.Ffree = s.Ffree
	resp.Bsize = uint32(s.Bsize)
	resp.Namelen = uint32(s.Namelen)
	resp.Frsize = uint32(s.Frsize)
	return nil
}

// errnoOf returns the errno an error stands for, EIO if none.
func errnoOf(err error) syscall.Errno {
	if en, ok := err.(syscall.Errno); ok {
		return en // most errors: no unwrapping to do
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	var fe fuse.ErrorNumber
	if errors.As(err, &fe) {
		return syscall.Errno(fe.Errno())
	}
	return syscall.EIO
}
