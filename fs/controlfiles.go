package fs

import (
	fusefs "bazil.org/fuse/fs"

	"github.com/lockfs/lockfs/fs/control"
	"github.com/lockfs/lockfs/lockmgr"
)

// The control files' place in the passthrough: package control serves
// them, and reaches their directory through control.Dir, which Dir
// implements here (but LockPath and WhereNow, where the directory is:
// node.go; RevalidateChildren: invalidate.go).

var _ control.Dir = (*Dir)(nil)

// controlNode returns the node of the control file of kind in directory d.
// Lookup and Create call it for the reserved names.
func (f *FS) controlNode(d *Dir, kind lockmgr.Kind) fusefs.Node {
	return f.ctl.Node(d, kind)
}

// Note returns what owner's descriptor wrote to the control file of lock
// id, "" if nothing; for status output outside the mount (lockfs status).
func (f *FS) Note(id lockmgr.LockID, owner lockmgr.Owner) string {
	return f.ctl.Note(id, owner)
}

// Control returns the mount's control files, for tests that look inside
// them (package control's).
func (f *FS) Control() *control.Files {
	return f.ctl
}

// BackingInode returns the identity of d's backing inode, from which the
// control files derive their inode numbers.
func (d *Dir) BackingInode() (dev, ino uint64, btime int64) {
	return d.key.dev, d.key.ino, d.key.btime
}
