package fs

import (
	"context"
	"errors"
	"syscall"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/lockmgr"
)

// Remove unlinks a file or removes an empty directory. Reserved names may
// not be removed; in a sticky directory only the owner of the file or of
// the directory (or root) may remove it. A directory that holds nothing
// but backing files looks empty and is removed with them, unless a lock on
// it is held (EBUSY; see rmdir.go).
func (d *Dir) Remove(ctx context.Context, req *fuse.RemoveRequest) error {
	name := req.Name
	op := "unlink"
	if req.Dir {
		op = "rmdir"
	}
	if d.fs.isReserved(name) {
		return d.fs.refuse(op, d.childPath(name), syscall.EPERM, "reserved name")
	}
	if err := checkName(name); err != nil {
		return err
	}
	var st inodeStat
	err := d.at(func(dirFd int, dirSt *inodeStat) error {
		if err := lstatAt(dirFd, name, &st); err != nil {
			return err
		}
		if !stickyAllows(dirSt, &st, req.Header.Uid) {
			return errSticky
		}
		if !req.Dir {
			return unix.Unlinkat(dirFd, name, 0)
		}
		err := unix.Unlinkat(dirFd, name, unix.AT_REMOVEDIR)
		if err != unix.ENOTEMPTY {
			return err
		}
		// Perhaps empty but for the hidden backing files (rmdir.go).
		if err := d.fs.removeBackingFiles(dirFd, d.relPath(), name, &st, int(req.Header.Pid)); err != nil {
			return err
		}
		return unix.Unlinkat(dirFd, name, unix.AT_REMOVEDIR)
	})
	if err == errSticky {
		return d.fs.refuse(op, d.childPath(name), syscall.EPERM, "sticky directory")
	}
	if errno, why, ok := backingRefusal(err); ok {
		return d.fs.refuse(op, d.childPath(name), errno, why)
	}
	if err != nil {
		return d.fs.fail(op, d.childPath(name), err)
	}
	if n := d.fs.lookupNode(keyOf(&st)); n != nil {
		d.fs.treeMu.Lock()
		n.base().dropLinkLocked(d, name)
		d.fs.treeMu.Unlock()
	}
	return nil
}

// errSticky is the verdict of a failed sticky-directory check.
var errSticky = errors.New("sticky directory: not the owner")

// stickyAllows applies the sticky-directory rule the kernel would: bazil
// cannot report the sticky bit to the kernel, so lockfs checks it.
func stickyAllows(dirSt, st *inodeStat, uid uint32) bool {
	if dirSt.Mode&unix.S_ISVTX == 0 || uid == 0 {
		return true
	}
	return uid == st.Uid || uid == dirSt.Uid
}

// Rename moves a name, possibly to another directory, replacing what the
// target name held. Reserved names may be neither source nor target. A
// target directory that holds nothing but backing files looks empty and is
// replaced, as by Remove (rmdir.go). A directory with a lock held on it or
// below it is not moved (EBUSY, as for a mount point): a lock is the lock
// of its directory's current path, and moving a held one would let the
// next user of the old path in beside its holder (guardTree).
// renameat2(2)'s RENAME_NOREPLACE and RENAME_EXCHANGE are those of
// SOURCE (the fork decodes FUSE_RENAME2, PATCHES.md); an exchange moves
// both names, so both are checked as the one moved is. RENAME_WHITEOUT
// (overlayfs's) is EINVAL, as on file systems without whiteouts.
func (d *Dir) Rename(ctx context.Context, req *fuse.RenameRequest, newDir fusefs.Node) error {
	nd, ok := newDir.(*Dir)
	if !ok {
		return syscall.EXDEV
	}
	if err := d.checkRename(req, nd); err != nil {
		return err
	}
	op := &renameOp{
		d: d, nd: nd, oldName: req.OldName, newName: req.NewName,
		flags: req.Flags, exchange: req.Flags&fuse.RenameExchange != 0,
		uid: req.Header.Uid, tid: int(req.Header.Pid),
	}
	err := d.at(func(oldFd int, oldDirSt *inodeStat) error {
		return nd.at(func(newFd int, newDirSt *inodeStat) error {
			return op.rename(oldFd, newFd, oldDirSt, newDirSt)
		})
	})
	if err == nil {
		d.fs.renamed(d, op.oldName, nd, op.newName, &op.st, &op.tst, op.replaced, op.exchange)
	}
	if op.moving {
		d.fs.moveMu.Unlock()
	}
	if op.gaveUp {
		if err == nil {
			// At its new name (an exchange moves it there too), it is
			// adopted if the new parent's new-dir lock is the creator's.
			nd.adoptNewDir(ctx, op.newName, op.tid)
		} else {
			d.fs.readopt(d.relPath(), op.oldName, op.tid)
		}
	}
	return op.answer(err)
}

// checkRename refuses the flags, and the names, that no rename through the
// mount may have.
func (d *Dir) checkRename(req *fuse.RenameRequest, nd *Dir) error {
	flags := req.Flags
	if flags&^(fuse.RenameNoReplace|fuse.RenameExchange) != 0 || flags == fuse.RenameNoReplace|fuse.RenameExchange {
		return syscall.EINVAL
	}
	oldName, newName := req.OldName, req.NewName
	if d.fs.isReserved(oldName) || d.fs.isReserved(newName) {
		return d.fs.refuse("rename", d.childPath(oldName)+" -> "+nd.childPath(newName), syscall.EPERM, "reserved name")
	}
	if err := checkName(oldName); err != nil {
		return err
	}
	return checkName(newName)
}

// renameOp is one rename through the mount: oldName of d to newName of
// nd, as Rename carries it out.
type renameOp struct {
	d, nd            *Dir
	oldName, newName string
	flags            fuse.RenameFlags
	exchange         bool   // RENAME_EXCHANGE
	uid              uint32 // the requester, for the sticky rule
	tid              int    // the requesting thread, for the adopted lock

	// What rename found and did.
	st, tst  inodeStat // the moved inode, and what newName held
	replaced bool      // newName held tst
	gaveUp   bool      // the moved directory's adopted lock was given up (rmdir.go)
	moving   bool      // a directory moves: moveMu is held for writing
}

// rename renames in SOURCE, from the directory oldFd (oldDirSt) to newFd
// (newDirSt), holding off the locks of a directory that moves (guardTree)
// until it is done.
func (op *renameOp) rename(oldFd, newFd int, oldDirSt, newDirSt *inodeStat) error {
	d, nd, f := op.d, op.nd, op.d.fs
	oldName, newName := op.oldName, op.newName
	if err := lstatAt(oldFd, oldName, &op.st); err != nil {
		return err
	}
	if !stickyAllows(oldDirSt, &op.st, op.uid) {
		return errSticky
	}
	switch err := lstatAt(newFd, newName, &op.tst); err {
	case nil:
		op.replaced = true
		if !stickyAllows(newDirSt, &op.tst, op.uid) {
			return errSticky
		}
	case unix.ENOENT:
	default:
		return err
	}
	if op.st.Mode&unix.S_IFMT == unix.S_IFDIR {
		// A directory made under an exclusive new-dir lock may
		// be renamed by its creator (mkdir tmp.x, fill it, mv
		// it into place): its adopted lock is given up for the
		// move and taken again at the new name.
		op.gaveUp = f.giveUpAdopted(d.relPath(), oldName, op.tid)
		f.moveMu.Lock()
		op.moving = true
		release, err := f.guardTree(joinRel(d.relPath(), oldName))
		if err != nil {
			return err
		}
		defer release()
	}
	if op.exchange && op.replaced && op.tst.Mode&unix.S_IFMT == unix.S_IFDIR {
		// The target directory moves too.
		if !op.moving {
			f.moveMu.Lock()
			op.moving = true
		}
		release, err := f.guardTree(joinRel(nd.relPath(), newName))
		if err != nil {
			return err
		}
		defer release()
	}
	if op.flags != 0 {
		return unix.Renameat2(oldFd, oldName, newFd, newName, uint(op.flags))
	}
	err := unix.Renameat(oldFd, oldName, newFd, newName)
	if !op.replaced || op.tst.Mode&unix.S_IFMT != unix.S_IFDIR || (err != unix.ENOTEMPTY && err != unix.EEXIST) {
		return err
	}
	// A target directory perhaps empty but for the hidden
	// backing files (rmdir.go).
	if err := f.removeBackingFiles(newFd, nd.relPath(), newName, &op.tst, op.tid); err != nil {
		return err
	}
	return unix.Renameat(oldFd, oldName, newFd, newName)
}

// answer returns the errno of a rename that failed with err, logged as
// its kind deserves (nil for nil).
func (op *renameOp) answer(err error) error {
	d, nd, f := op.d, op.nd, op.d.fs
	if err == errSticky {
		return f.refuse("rename", d.childPath(op.oldName), syscall.EPERM, "sticky directory")
	}
	if errors.Is(err, lockmgr.ErrBusy) {
		return f.refuse("rename", d.childPath(op.oldName)+" -> "+nd.childPath(op.newName), syscall.EBUSY, err.Error())
	}
	if errno, why, ok := backingRefusal(err); ok {
		return f.refuse("rename", d.childPath(op.oldName)+" -> "+nd.childPath(op.newName), errno, "target: "+why)
	}
	if err != nil {
		return f.fail("rename", d.childPath(op.oldName), err)
	}
	return nil
}

// renamed records in the tree a rename that succeeded: oldName of d (st)
// is now newName of nd, where it replaced tst if replaced (or, exchange,
// took its place).
func (f *FS) renamed(d *Dir, oldName string, nd *Dir, newName string, st, tst *inodeStat, replaced, exchange bool) {
	if replaced && keyOf(tst) == keyOf(st) {
		return // two names of one inode: rename(2) does nothing
	}
	moved := f.lookupNode(keyOf(st))
	var gone passNode
	if replaced {
		gone = f.lookupNode(keyOf(tst))
	}
	f.treeMu.Lock()
	defer f.treeMu.Unlock()
	if moved != nil {
		moved.base().moveLinkLocked(d, oldName, nd, newName)
	}
	if gone != nil {
		if exchange {
			gone.base().moveLinkLocked(nd, newName, d, oldName)
		} else {
			gone.base().dropLinkLocked(nd, newName)
		}
	}
}

// guardTree keeps the locks at the directory rel (relPath's form, which is
// the engine's, joined to a checked name) and below it from being
// held while it is renamed: it fails with an error wrapping
// lockmgr.ErrBusy if one is held (lockmgr.Engine.GuardTree), else holds new
// grants off until release.
func (f *FS) guardTree(rel string) (release func(), err error) {
	if f.cfg.Engine == nil {
		return func() {}, nil
	}
	return f.cfg.Engine.GuardTree(rel)
}

// Link makes a new name for an existing file (not a directory, not a
// control file).
func (d *Dir) Link(ctx context.Context, req *fuse.LinkRequest, old fusefs.Node) (fusefs.Node, error) {
	name := req.NewName
	if d.fs.isReserved(name) {
		return nil, d.fs.refuse("link", d.childPath(name), syscall.EPERM, "reserved name")
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	of, ok := old.(*File)
	if !ok {
		return nil, d.fs.refuse("link", d.childPath(name), syscall.EPERM, "not a linkable file")
	}
	var st inodeStat
	err := d.at(func(dirFd int, _ *inodeStat) error {
		if err := of.linkInto(dirFd, name); err != nil {
			return err
		}
		return lstatAt(dirFd, name, &st)
	})
	if err != nil {
		return nil, d.fs.fail("link", d.childPath(name), err)
	}
	if keyOf(&st) != of.key {
		// Replaced in SOURCE between the link and the check.
		n := d.fs.nodeFor(&st, d, name)
		setEntryAttr(ctx, n, &st)
		return n, nil
	}
	of.addLink(d, name)
	setEntryAttr(ctx, of, &st)
	return of, nil
}
