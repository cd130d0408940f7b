package control

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/lockmgr"
)

// The control files of one mount (Files), and what they need of it: the
// engine (Config) and, of each directory, Dir.

// Dir is what a control file needs of its directory. fs's Dir implements
// it; the control files reach SOURCE only through it.
type Dir interface {
	// Attr reports the directory's attributes; a control file's owner
	// and times are derived from them, and permission to lock is
	// checked against them (permit).
	Attr(ctx context.Context, a *fuse.Attr) error
	// LockPath is the directory's path now, relative to the mount root,
	// in the engine's form ("." for the root): the path of its locks.
	LockPath() string
	// WhereNow is LockPath for a lock request that may have waited while
	// the directory moved: it waits for a rename through the mount that
	// is under way and, if checkFound, reports whether SOURCE has the
	// directory's inode at that path (lock.go, # Renames).
	WhereNow(checkFound bool) (path string, found bool)
	// RevalidateChildren drops the kernel's cached names and attributes
	// of the directory's children, after a directory lock is granted.
	RevalidateChildren()
	// BackingInode identifies the directory's backing inode: device,
	// inode number and birth time (0 where the file system has none).
	BackingInode() (dev, ino uint64, btime int64)
}

// Config is what the control files of a mount need.
type Config struct {
	// Engine arbitrates the directory locks. Required.
	Engine *lockmgr.Engine
	// Logger receives one line per refused or failed lock request. Required.
	Logger logrus.FieldLogger
	// Observer, if set, is told about the requests refused before the
	// engine sees them (EACCES: no permission on the directory).
	Observer lockmgr.Observer
	// AttrValid is how long the kernel may keep a control file's
	// attributes: those of its directory, from which they derive.
	AttrValid time.Duration
}

// Files is the control-file half of a mount: the node cache and the
// source of flock owner ids.
type Files struct {
	// Dependencies
	engine *lockmgr.Engine
	log    logrus.FieldLogger
	obs    lockmgr.Observer // nil: none

	// Constant data
	attrValid time.Duration
	refusals  *refusalLimiter // which refusals are logged

	// nextOwner numbers the open file descriptions of control files; each
	// is one flock owner. Handle IDs cannot serve: bazil reuses them.
	nextOwner atomic.Uint64

	// Mutable state
	mu sync.Mutex
	// nodes holds one node per control file, so that Lookup returns the
	// same Node each time. A node leaves when the kernel forgets it and no
	// handle of it is open. GUARDED_BY(mu)
	nodes map[nodeKey]*controlNode
}

// nodeKey names a control file: its directory node and its kind. The key
// is the node, not the directory's path: a control file belongs to its
// directory wherever a rename takes it, and a new directory made under an
// old name gets control files of its own (the lock is always that of the
// directory's current path: controlNode.lockID).
type nodeKey struct {
	dir  Dir
	kind lockmgr.Kind
}

// New returns the control files of a mount.
func New(cfg Config) *Files {
	return &Files{
		engine:    cfg.Engine,
		log:       cfg.Logger,
		obs:       cfg.Observer,
		attrValid: cfg.AttrValid,
		refusals:  newRefusalLimiter(nil),
		nodes:     make(map[nodeKey]*controlNode),
	}
}

// Node returns the node of the control file of kind in directory d. fs's
// Lookup and Create call it for the control names.
func (c *Files) Node(d Dir, kind lockmgr.Kind) fusefs.Node {
	return c.node(d, kind)
}

func (c *Files) node(d Dir, kind lockmgr.Kind) *controlNode {
	key := nodeKey{dir: d, kind: kind}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.nodes[key]; n != nil {
		return n
	}
	n := &controlNode{
		c:     c,
		dir:   d,
		kind:  kind,
		inode: Inode(d, kind),
	}
	c.nodes[key] = n
	return n
}

// Inode derives a stable inode number for the control file of kind in d
// from the directory's backing inode, so that it survives renames; fs's
// readdir lists the control files with it. Numbers 0 and 1 are avoided (1
// is the root).
func Inode(d Dir, kind lockmgr.Kind) uint64 {
	dev, ino, btime := d.BackingInode()
	h := fnv.New64a()
	var b [25]byte
	binary.LittleEndian.PutUint64(b[0:], dev)
	binary.LittleEndian.PutUint64(b[8:], ino)
	binary.LittleEndian.PutUint64(b[16:], uint64(btime))
	b[24] = byte(kind)
	_, _ = h.Write(b[:])
	ino = h.Sum64()
	if ino < 2 {
		ino += 2
	}
	return ino
}
