package fs

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"syscall"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
	"golang.org/x/sys/unix"
)

// Dir is a directory of SOURCE.
type Dir struct {
	node
}

var (
	_ fusefs.Node                = (*Dir)(nil)
	_ fusefs.NodeGetattrer       = (*Dir)(nil)
	_ fusefs.NodeSetattrer       = (*Dir)(nil)
	_ fusefs.NodeRequestLookuper = (*Dir)(nil)
	_ fusefs.NodeOpener          = (*Dir)(nil)
	_ fusefs.NodeCreater         = (*Dir)(nil)
	_ fusefs.NodeMkdirer         = (*Dir)(nil)
	_ fusefs.NodeMknoder         = (*Dir)(nil)
	_ fusefs.NodeSymlinker       = (*Dir)(nil)
	_ fusefs.NodeLinker          = (*Dir)(nil)
	_ fusefs.NodeRemover         = (*Dir)(nil)
	_ fusefs.NodeRenamer         = (*Dir)(nil)
	_ fusefs.NodeFsyncer         = (*Dir)(nil)
	_ fusefs.NodeForgetter       = (*Dir)(nil)
	_ fusefs.NodeGetxattrer      = (*Dir)(nil)
	_ fusefs.NodeListxattrer     = (*Dir)(nil)
	_ fusefs.NodeSetxattrer      = (*Dir)(nil)
	_ fusefs.NodeRemovexattrer   = (*Dir)(nil)
)

// childPath is the path of name in d, for logs.
func (d *Dir) childPath(name string) string {
	return joinRel(d.relPath(), name)
}

// at calls fn with an O_PATH descriptor of d and d's attributes, for an
// operation on a name in d.
func (d *Dir) at(fn func(dirFd int, dirSt *inodeStat) error) error {
	fd, err := d.openByName(unix.O_PATH | unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer closeFd(fd)
	var st inodeStat
	if err := fstat(fd, &st); err != nil {
		return err
	}
	return fn(fd, &st)
}

// Lookup finds name in d. The control names are the control files; the
// backing names do not exist.
func (d *Dir) Lookup(ctx context.Context, req *fuse.LookupRequest, resp *fuse.LookupResponse) (fusefs.Node, error) {
	name := req.Name
	if kind, ok := controlKind(name); ok {
		resp.EntryValid = entryValid
		return d.fs.controlNode(d, kind), nil
	}
	if backingNames[name] {
		return nil, syscall.ENOENT
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	var st inodeStat
	err := d.at(func(dirFd int, _ *inodeStat) error {
		return lstatAt(dirFd, name, &st)
	})
	if err != nil {
		return nil, d.fs.fail("lookup", d.childPath(name), err)
	}
	resp.EntryValid = entryValid
	return d.fs.nodeFor(&st, d, name), nil
}

// Open opens the directory for reading its entries.
func (d *Dir) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fusefs.Handle, error) {
	fd, err := d.openByName(unix.O_RDONLY | unix.O_DIRECTORY)
	if err != nil {
		// Removed, but still open elsewhere: a new open file description
		// of the same directory (its own offset).
		dup := d.dupOpen(false)
		if dup < 0 {
			return nil, d.fs.fail("opendir", d.path(), err)
		}
		fd, err = reopen(dup, unix.O_RDONLY|unix.O_DIRECTORY)
		closeFd(dup)
		if err != nil {
			return nil, d.fs.fail("opendir", d.path(), err)
		}
	}
	h := &dirHandle{d: d, of: &openFile{fd: fd}}
	d.addOpen(h.of)
	return h, nil
}

// dirHandle is an open directory.
type dirHandle struct {
	// Dependencies
	d *Dir

	// Constant data
	of *openFile

	// Mutable state
	// mu serializes reads of the directory descriptor's offset.
	mu sync.Mutex
}

var (
	_ fusefs.HandleReadDirAller = (*dirHandle)(nil)
	_ fusefs.HandleReleaser     = (*dirHandle)(nil)
)

// ReadDirAll lists the directory from its start: the backing entries but
// the reserved names, then the three control files.
func (h *dirHandle) ReadDirAll(ctx context.Context) ([]fuse.Dirent, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := unix.Seek(h.of.fd, 0, 0); err != nil {
		return nil, h.d.fs.fail("readdir", h.d.path(), err)
	}
	var out []fuse.Dirent
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(h.of.fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, h.d.fs.fail("readdir", h.d.path(), err)
		}
		if n <= 0 {
			break
		}
		out = appendDirents(out, buf[:n])
	}
	for _, name := range []string{".lock", ".lock_newdir", ".lock_usage"} {
		out = append(out, fuse.Dirent{Name: name, Type: fuse.DT_File})
	}
	return out, nil
}

// appendDirents parses linux_dirent64 records, leaving out reserved names.
func appendDirents(out []fuse.Dirent, buf []byte) []fuse.Dirent {
	for len(buf) >= 19 {
		ino := binary.NativeEndian.Uint64(buf[0:8])
		reclen := int(binary.NativeEndian.Uint16(buf[16:18]))
		typ := buf[18]
		if reclen < 19 || reclen > len(buf) {
			break
		}
		nameb := buf[19:reclen]
		for i, c := range nameb {
			if c == 0 {
				nameb = nameb[:i]
				break
			}
		}
		name := string(nameb)
		buf = buf[reclen:]
		if isReserved(name) {
			continue
		}
		out = append(out, fuse.Dirent{Inode: ino, Type: fuse.DirentType(typ), Name: name})
	}
	return out
}

// Release closes the directory.
func (h *dirHandle) Release(ctx context.Context, req *fuse.ReleaseRequest) error {
	h.d.removeOpen(h.of)
	closeFd(h.of.fd)
	return nil
}

// newOwner gives a file just created by the daemon to the process that
// asked for it (when the daemon is root) and the permissions it asked for
// (the daemon's own umask must not apply; the kernel already applied the
// caller's). In a setgid directory the file keeps the directory's group,
// and a new directory keeps the setgid bit, as the backing file system set
// them. fd is a descriptor of the new inode.
func (f *FS) newOwner(fd int, hdr *fuse.Header, perm uint32, dirSt *inodeStat) error {
	var st inodeStat
	if err := fstat(fd, &st); err != nil {
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
		}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	want := perm & 0o7777
	if setgidDir && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		want |= unix.S_ISGID
	}
	if err := fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&0o7777 != want {
		return unix.Chmod(procFdPath(fd), want)
	}
	return nil
}

// Mkdir creates a directory.
func (d *Dir) Mkdir(ctx context.Context, req *fuse.MkdirRequest) (fusefs.Node, error) {
	name := req.Name
	if isReserved(name) {
		return nil, d.fs.refuse("mkdir", d.childPath(name), syscall.EEXIST, "reserved name")
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	perm := unixPerm(req.Mode)
	var st inodeStat
	err := d.at(func(dirFd int, dirSt *inodeStat) error {
		if err := unix.Mkdirat(dirFd, name, perm&0o7777); err != nil {
			return err
		}
		fd, err := openBeneath(dirFd, name, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err == nil {
			err = d.fs.newOwner(fd, &req.Header, perm, dirSt)
			if err == nil {
				err = fstat(fd, &st)
			}
			closeFd(fd)
		}
		if err != nil {
			_ = unix.Unlinkat(dirFd, name, unix.AT_REMOVEDIR)
		}
		return err
	})
	if err != nil {
		return nil, d.fs.fail("mkdir", d.childPath(name), err)
	}
	return d.fs.nodeForNew(&st, d, name, true), nil
}

// Mknod creates a special file (a FIFO, a socket, or a device for a caller
// the kernel allowed to).
func (d *Dir) Mknod(ctx context.Context, req *fuse.MknodRequest) (fusefs.Node, error) {
	name := req.Name
	if isReserved(name) {
		return nil, d.fs.refuse("mknod", d.childPath(name), syscall.EEXIST, "reserved name")
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	perm := unixPerm(req.Mode)
	var st inodeStat
	err := d.at(func(dirFd int, dirSt *inodeStat) error {
		if err := unix.Mknodat(dirFd, name, unixType(req.Mode)|perm&0o7777, int(req.Rdev)); err != nil {
			return err
		}
		fd, err := openBeneath(dirFd, name, unix.O_PATH, 0)
		if err == nil {
			err = d.fs.newOwner(fd, &req.Header, perm, dirSt)
			if err == nil {
				err = fstat(fd, &st)
			}
			closeFd(fd)
		}
		if err != nil {
			_ = unix.Unlinkat(dirFd, name, 0)
		}
		return err
	})
	if err != nil {
		return nil, d.fs.fail("mknod", d.childPath(name), err)
	}
	return d.fs.nodeForNew(&st, d, name, true), nil
}

// Symlink creates a symbolic link. Its target is stored as given and never
// followed by lockfs.
func (d *Dir) Symlink(ctx context.Context, req *fuse.SymlinkRequest) (fusefs.Node, error) {
	name := req.NewName
	if isReserved(name) {
		return nil, d.fs.refuse("symlink", d.childPath(name), syscall.EEXIST, "reserved name")
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	var st inodeStat
	err := d.at(func(dirFd int, dirSt *inodeStat) error {
		if err := unix.Symlinkat(req.Target, dirFd, name); err != nil {
			return err
		}
		fd, err := openBeneath(dirFd, name, unix.O_PATH, 0)
		if err == nil {
			err = d.fs.newOwner(fd, &req.Header, 0o777, dirSt)
			if err == nil {
				err = fstat(fd, &st)
			}
			closeFd(fd)
		}
		if err != nil {
			_ = unix.Unlinkat(dirFd, name, 0)
		}
		return err
	})
	if err != nil {
		return nil, d.fs.fail("symlink", d.childPath(name), err)
	}
	return d.fs.nodeForNew(&st, d, name, true), nil
}

// Create creates and opens a regular file. A control name is the control
// file (opening it changes nothing); a backing name may not be created.
func (d *Dir) Create(ctx context.Context, req *fuse.CreateRequest, resp *fuse.CreateResponse) (fusefs.Node, fusefs.Handle, error) {
	name := req.Name
	excl := req.Flags&fuse.OpenExclusive != 0
	if kind, ok := controlKind(name); ok {
		if excl {
			return nil, nil, d.fs.refuse("create", d.childPath(name), syscall.EEXIST, "control file exists")
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
	if backingNames[name] {
		if excl {
			return nil, nil, d.fs.refuse("create", d.childPath(name), syscall.EEXIST, "reserved name")
		}
		return nil, nil, d.fs.refuse("create", d.childPath(name), syscall.EPERM, "reserved name")
	}
	if err := checkName(name); err != nil {
		return nil, nil, err
	}
	flags := backingOpenFlags(req.Flags)
	perm := unixPerm(req.Mode)
	var st inodeStat
	fd := -1
	created := false
	err := d.at(func(dirFd int, dirSt *inodeStat) error {
		for attempt := 0; ; attempt++ {
			var err error
			fd, err = unix.Openat(dirFd, name, flags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, perm&0o7777)
			if err == nil {
				if err = d.fs.newOwner(fd, &req.Header, perm, dirSt); err != nil {
					closeFd(fd)
					fd = -1
					_ = unix.Unlinkat(dirFd, name, 0)
					return err
				}
				created = true
				break
			}
			if err != unix.EEXIST || excl {
				return err
			}
			// The name appeared since the kernel looked: open what is
			// there, as open(2) without O_EXCL would.
			fd, err = unix.Openat(dirFd, name, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
			if err == nil {
				break
			}
			if err != unix.ENOENT || attempt > 8 {
				if err == unix.ELOOP {
					err = syscall.ESTALE // a symlink: let the kernel look again
				}
				return err
			}
		}
		if err := fstat(fd, &st); err != nil {
			closeFd(fd)
			fd = -1
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			closeFd(fd)
			fd = -1
			return syscall.ESTALE
		}
		return nil
	})
	if err != nil {
		return nil, nil, d.fs.fail("create", d.childPath(name), err)
	}
	if err := clearNonblock(fd, req.Flags); err != nil {
		closeFd(fd)
		return nil, nil, d.fs.fail("create", d.childPath(name), err)
	}
	n := d.fs.nodeForNew(&st, d, name, created)
	f, ok := n.(*File)
	if !ok {
		closeFd(fd)
		return nil, nil, d.fs.fail("create", d.childPath(name), syscall.EIO)
	}
	h, err := f.newHandle(fd)
	if err != nil {
		return nil, nil, d.fs.fail("create", d.childPath(name), err)
	}
	resp.EntryValid = entryValid
	return f, h, nil
}

// Remove unlinks a file or removes an empty directory. Reserved names may
// not be removed; in a sticky directory only the owner of the file or of
// the directory (or root) may remove it.
func (d *Dir) Remove(ctx context.Context, req *fuse.RemoveRequest) error {
	name := req.Name
	op := "unlink"
	if req.Dir {
		op = "rmdir"
	}
	if isReserved(name) {
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
		flags := 0
		if req.Dir {
			flags = unix.AT_REMOVEDIR
		}
		return unix.Unlinkat(dirFd, name, flags)
	})
	if err == errSticky {
		return d.fs.refuse(op, d.childPath(name), syscall.EPERM, "sticky directory")
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
// target name held. Reserved names may be neither source nor target.
// (bazil does not decode RENAME2, so the kernel answers renameat2 flags
// with EINVAL before asking.)
func (d *Dir) Rename(ctx context.Context, req *fuse.RenameRequest, newDir fusefs.Node) error {
	nd, ok := newDir.(*Dir)
	if !ok {
		return syscall.EXDEV
	}
	oldName, newName := req.OldName, req.NewName
	if isReserved(oldName) || isReserved(newName) {
		return d.fs.refuse("rename", d.childPath(oldName)+" -> "+nd.childPath(newName), syscall.EPERM, "reserved name")
	}
	if err := checkName(oldName); err != nil {
		return err
	}
	if err := checkName(newName); err != nil {
		return err
	}
	var st, tst inodeStat
	replaced := false
	err := d.at(func(oldFd int, oldDirSt *inodeStat) error {
		return nd.at(func(newFd int, newDirSt *inodeStat) error {
			if err := lstatAt(oldFd, oldName, &st); err != nil {
				return err
			}
			if !stickyAllows(oldDirSt, &st, req.Header.Uid) {
				return errSticky
			}
			switch err := lstatAt(newFd, newName, &tst); err {
			case nil:
				replaced = true
				if !stickyAllows(newDirSt, &tst, req.Header.Uid) {
					return errSticky
				}
			case unix.ENOENT:
			default:
				return err
			}
			return unix.Renameat(oldFd, oldName, newFd, newName)
		})
	})
	if err == errSticky {
		return d.fs.refuse("rename", d.childPath(oldName), syscall.EPERM, "sticky directory")
	}
	if err != nil {
		return d.fs.fail("rename", d.childPath(oldName), err)
	}
	if replaced && keyOf(&tst) == keyOf(&st) {
		return nil // two names of one inode: rename(2) does nothing
	}
	moved := d.fs.lookupNode(keyOf(&st))
	var gone passNode
	if replaced {
		gone = d.fs.lookupNode(keyOf(&tst))
	}
	d.fs.treeMu.Lock()
	if moved != nil {
		moved.base().moveLinkLocked(d, oldName, nd, newName)
	}
	if gone != nil {
		gone.base().dropLinkLocked(nd, newName)
	}
	d.fs.treeMu.Unlock()
	return nil
}

// Link makes a new name for an existing file (not a directory, not a
// control file).
func (d *Dir) Link(ctx context.Context, req *fuse.LinkRequest, old fusefs.Node) (fusefs.Node, error) {
	name := req.NewName
	if isReserved(name) {
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
		return d.fs.nodeFor(&st, d, name), nil
	}
	of.addLink(d, name)
	return of, nil
}
