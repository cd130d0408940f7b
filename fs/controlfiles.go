package fs

import (
	fusefs "bazil.org/fuse/fs"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/fs/control"
	"github.com/lockfs/lockfs/lockmgr"
)

// The control files' place in the passthrough: package control serves
// them, and reaches their directory through control.Dir, which Dir
// implements here (but RevalidateChildren: invalidate.go).

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

// LockPath returns d's path in the engine's form ("." for the root): the
// path of the locks its control files take. relPath's paths are in that
// form already: every name in them passed checkName.
func (d *Dir) LockPath() string {
	return d.relPath()
}

// WhereNow returns d's path now, in the engine's form, for a lock request
// that may have waited while d moved (control/lock.go, # Renames). If checkFound,
// found reports whether SOURCE has d's inode at that path. It waits for a
// rename of a directory through the mount that is under way (moveMu), so
// that it sees d either where it was before or where it is after.
func (d *Dir) WhereNow(checkFound bool) (path string, found bool) {
	d.fs.moveMu.RLock()
	defer d.fs.moveMu.RUnlock()
	rel := d.relPath()
	if !checkFound || d == d.fs.root {
		return rel, true
	}
	fd, err := openBeneath(d.fs.rootFd, rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return rel, false
	}
	defer closeFd(fd)
	var st inodeStat
	return rel, fstat(fd, &st) == nil && keyOf(&st) == d.key
}

// BackingInode returns the identity of d's backing inode, from which the
// control files derive their inode numbers.
func (d *Dir) BackingInode() (dev, ino uint64, btime int64) {
	return d.key.dev, d.key.ino, d.key.btime
}
