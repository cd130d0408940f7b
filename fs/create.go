package fs

import (
	"context"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/lockmgr"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
	"golang.org/x/sys/unix"
)

// newOwner gives a file just created by the daemon to the process that
// asked for it (when the daemon is root) and the permissions it asked for
// (the daemon's own umask must not apply; the kernel already applied the
// caller's). In a setgid directory the file keeps the directory's group,
// and a new directory keeps the setgid bit, as the backing file system set
// them. fd is a descriptor of the new inode; st receives its attributes
// once they are final (it is read again only after a change).
func (f *FS) newOwner(fd int, hdr *fuse.Header, perm uint32, dirSt, st *inodeStat) error {
	if err := fstat(fd, st); err != nil {
		return err
	}
	setgidDir := dirSt.Mode&unix.S_ISGID != 0
	if f.asRoot {
		uid, gid := int(hdr.Uid), int(hdr.Gid)
		if setgidDir {
			gid = -1
		}
		if uint32(uid) != st.Uid || (gid >= 0 && uint32(gid) != st.Gid) {
			if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			// chown may clear the setuid and setgid bits.
			if err := fstat(fd, st); err != nil {
				return err
			}
		}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	want := perm & 0o7777
	if setgidDir && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		want |= unix.S_ISGID
	}
	if st.Mode&0o7777 == want {
		return nil
	}
	if err := unix.Chmod(procFdPath(fd), want); err != nil {
		return err
	}
	return fstat(fd, st)
}

// Mkdir creates a directory.
func (d *Dir) Mkdir(ctx context.Context, req *fuse.MkdirRequest) (fusefs.Node, error) {
	perm := unixPerm(req.Mode)
	n, _, err := d.makeEntry("mkdir", req.Name, &req.Header, perm, unix.O_PATH|unix.O_DIRECTORY, unix.AT_REMOVEDIR,
		func(dirFd int) error { return unix.Mkdirat(dirFd, req.Name, perm&0o7777) })
	if err != nil {
		return nil, err
	}
	// The lock backend may change the new directory (its lock files), so
	// its attributes are read again for the answer (no setEntryAttr).
	d.adoptNewDir(ctx, req.Name, int(req.Header.Pid))
	return n, nil
}

// adoptNewDir applies the new-dir rule (SPEC §2): a directory created by a
// process whose lineage holds this directory's new-dir lock exclusively is,
// in effect, locked exclusively by that holder (lockmgr.AdoptNewDir). The
// directory exists either way; a failure is logged.
func (d *Dir) adoptNewDir(ctx context.Context, name string, tid int) {
	e := d.fs.cfg.Engine
	if e == nil {
		return
	}
	adopted, err := e.AdoptNewDir(context.WithoutCancel(ctx), d.relPath(), name, tid)
	switch {
	case err != nil:
		d.fs.log.WithError(err).WithFields(logrus.Fields{"path": d.childPath(name), "pid": tid}).
			Warn("new directory created under an exclusive new-dir lock could not be locked for its creator")
	case adopted:
		d.fs.log.WithFields(logrus.Fields{"path": d.childPath(name), "pid": tid}).
			Debug("new directory locked for the holder of the new-dir lock")
	}
}

// Mknod creates a special file (a FIFO, a socket, or a device for a caller
// the kernel allowed to).
func (d *Dir) Mknod(ctx context.Context, req *fuse.MknodRequest) (fusefs.Node, error) {
	perm := unixPerm(req.Mode)
	n, st, err := d.makeEntry("mknod", req.Name, &req.Header, perm, unix.O_PATH, 0, func(dirFd int) error {
		return unix.Mknodat(dirFd, req.Name, unixType(req.Mode)|perm&0o7777, int(req.Rdev))
	})
	if err != nil {
		return nil, err
	}
	setEntryAttr(ctx, n, &st)
	return n, nil
}

// Symlink creates a symbolic link. Its target is stored as given and never
// followed by lockfs.
func (d *Dir) Symlink(ctx context.Context, req *fuse.SymlinkRequest) (fusefs.Node, error) {
	n, st, err := d.makeEntry("symlink", req.NewName, &req.Header, 0o777, unix.O_PATH, 0, func(dirFd int) error {
		return unix.Symlinkat(req.Target, dirFd, req.NewName)
	})
	if err != nil {
		return nil, err
	}
	setEntryAttr(ctx, n, &st)
	return n, nil
}

// makeEntry creates name in d with mk, gives it to the requesting user
// (newOwner) and returns its node and attributes; if anything after mk
// fails, the new entry is removed again (unlinkat with rmFlags). Reserved
// names are refused with EEXIST.
func (d *Dir) makeEntry(op, name string, hdr *fuse.Header, perm uint32, openFlags, rmFlags int, mk func(dirFd int) error) (passNode, inodeStat, error) {
	var st inodeStat
	if d.fs.isReserved(name) {
		return nil, st, d.fs.refuse(op, d.childPath(name), syscall.EEXIST, "reserved name")
	}
	if err := checkName(name); err != nil {
		return nil, st, err
	}
	err := d.at(func(dirFd int, dirSt *inodeStat) error {
		if err := mk(dirFd); err != nil {
			return err
		}
		fd, err := openBeneath(dirFd, name, openFlags, 0)
		if err == nil {
			err = d.fs.newOwner(fd, hdr, perm, dirSt, &st)
			closeFd(fd)
		}
		if err != nil {
			_ = unix.Unlinkat(dirFd, name, rmFlags)
		}
		return err
	})
	if err != nil {
		return nil, st, d.fs.fail(op, d.childPath(name), err)
	}
	return d.fs.nodeForNew(&st, d, name, true), st, nil
}

// Create creates and opens a regular file. A control name is the control
// file (opening it changes nothing); a backing name may not be created.
func (d *Dir) Create(ctx context.Context, req *fuse.CreateRequest, resp *fuse.CreateResponse) (fusefs.Node, fusefs.Handle, error) {
	name := req.Name
	if kind, ok := controlKind(name); ok {
		return d.createControl(ctx, kind, req, resp)
	}
	if d.fs.isBacking(name) {
		if req.Flags&fuse.OpenExclusive != 0 {
			return nil, nil, d.fs.refuse("create", d.childPath(name), syscall.EEXIST, "reserved name")
		}
		return nil, nil, d.fs.refuse("create", d.childPath(name), syscall.EPERM, "reserved name")
	}
	if err := checkName(name); err != nil {
		return nil, nil, err
	}
	// Counted before anything is created: a refused create has no effect.
	if err := d.fs.takeHandle("create", func() string { return d.childPath(name) }, req.Uid); err != nil {
		return nil, nil, err
	}
	opened := false
	defer func() {
		if !opened {
			d.fs.handles.give(req.Uid)
		}
	}()
	flags := backingOpenFlags(req.Flags)
	var st inodeStat
	fd := -1
	created := false
	err := d.at(func(dirFd int, dirSt *inodeStat) (err error) {
		fd, created, err = d.createAt(dirFd, dirSt, req, flags, &st)
		return err
	})
	if err != nil {
		return nil, nil, d.fs.fail("create", d.childPath(name), err)
	}
	n := d.fs.nodeForNew(&st, d, name, created)
	f, ok := n.(*File)
	if !ok {
		closeFd(fd)
		return nil, nil, d.fs.fail("create", d.childPath(name), syscall.EIO)
	}
	h := f.newHandle(fd, flags, &st, req.Uid)
	opened = true
	h.answerOpen(&st, &resp.OpenResponse)
	setEntryAttr(ctx, f, &st)
	resp.EntryValid = entryValid
	return f, h, nil
}

// createControl answers a create of a control name: an exclusive one
// fails (the control file exists), any other opens the control file.
func (d *Dir) createControl(ctx context.Context, kind lockmgr.Kind, req *fuse.CreateRequest, resp *fuse.CreateResponse) (fusefs.Node, fusefs.Handle, error) {
	if req.Flags&fuse.OpenExclusive != 0 {
		return nil, nil, d.fs.refuse("create", d.childPath(req.Name), syscall.EEXIST, "control file exists")
	}
	n := d.fs.controlNode(d, kind)
	resp.EntryValid = entryValid
	opener, ok := n.(fusefs.NodeOpener)
	if !ok {
		return n, n, nil
	}
	oreq := &fuse.OpenRequest{Header: req.Header, Flags: req.Flags &^ (fuse.OpenCreate | fuse.OpenExclusive | fuse.OpenTruncate)}
	h, err := opener.Open(ctx, oreq, &resp.OpenResponse)
	if err != nil {
		return nil, nil, err
	}
	return n, h, nil
}

// createAt creates req.Name in the directory dirFd (dirSt), or, unless the
// create is exclusive, opens the regular file that appeared there since the
// kernel looked, as open(2) without O_EXCL would; flags are the backing
// open flags. It returns the descriptor, whether it created the file, and
// the file's attributes in st.
func (d *Dir) createAt(dirFd int, dirSt *inodeStat, req *fuse.CreateRequest, flags int, st *inodeStat) (fd int, created bool, err error) {
	name := req.Name
	perm := unixPerm(req.Mode)
	for attempt := 0; ; attempt++ {
		// No O_NONBLOCK guard (unless asked for): an exclusive
		// create opens only the regular file it creates.
		fd, err = unix.Openat(dirFd, name, flags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm&0o7777)
		if err == nil {
			if err = d.fs.newOwner(fd, &req.Header, perm, dirSt, st); err != nil {
				closeFd(fd)
				_ = unix.Unlinkat(dirFd, name, 0)
				return -1, false, err
			}
			return fd, true, nil // st is the new file's, from newOwner
		}
		if err != unix.EEXIST || req.Flags&fuse.OpenExclusive != 0 {
			return -1, false, err
		}
		// The name appeared since the kernel looked: open what is
		// there, as open(2) without O_EXCL would.
		fd, err = unix.Openat(dirFd, name, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			if err := openedExisting(fd, req, flags, st); err != nil {
				closeFd(fd)
				return -1, false, err
			}
			return fd, false, nil
		}
		if err != unix.ENOENT || attempt > 8 {
			if err == unix.ELOOP {
				err = syscall.ESTALE // a symlink: let the kernel look again
			}
			return -1, false, err
		}
	}
}

// openedExisting readies fd, an existing file that a create opened: it
// clears the set-id bits if the caller truncates it without CAP_FSETID,
// fills st, checks that it is a regular file (ESTALE if not: the kernel
// looks again) and drops the O_NONBLOCK guard unless asked for. The
// caller closes fd if it fails.
func openedExisting(fd int, req *fuse.CreateRequest, flags int, st *inodeStat) error {
	if req.OpenFlags&fuse.OpenKillSUIDGID != 0 && flags&unix.O_TRUNC != 0 {
		// An existing file truncated by a caller without
		// CAP_FSETID (setid.go).
		if _, err := killSetID(fd); err != nil {
			return err
		}
	}
	if err := fstat(fd, st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return syscall.ESTALE
	}
	return clearNonblock(fd, flags)
}
