package fs

import (
	"context"
	"errors"
	"syscall"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"
)

// stat returns the backing inode's attributes: from an open handle's
// descriptor if there is one (exact even for an unlinked file), else from
// the inode found by name (statTop, or the check openByName makes), else,
// for a file with detached handles and no name left, by file handle
// (detach.go): a name is one statx where a file handle is an open.
func (n *node) stat() (inodeStat, error) {
	var st inodeStat
	if of := n.borrowHeld(false); of != nil {
		err := fstat(of.fd, &st)
		n.returnOpen(of)
		return st, err
	}
	ok, err := n.statTop(&st)
	if !ok {
		var fd int
		if fd, err = n.openByName(unix.O_PATH, &st); err == nil {
			closeFd(fd)
		}
	}
	if err != nil {
		if of := n.openDetached(false); of != nil {
			err = fstat(of.fd, &st)
			n.returnOpen(of)
		}
	}
	return st, err
}

// statTop is openByName and a statx in one system call, for the root and
// for a node whose only name is in SOURCE's top directory: one statx of
// the name beneath rootFd, not following a symlink. With no directory
// between rootFd and the name, the lookup follows no symlink and cannot
// leave SOURCE, which is what openat2's RESOLVE flags ensure for longer
// paths; the node's inode is then checked as openByName checks it. It
// saves an openat2 and a close, twice per create and unlink in a top
// directory (default_permissions has the kernel ask for the directory's
// attributes after each change in it). ok is false where it does not
// apply.
func (n *node) statTop(st *inodeStat) (ok bool, err error) {
	if n == &n.fs.root.node {
		err = fstat(n.fs.rootFd, st)
		if err == nil && keyOf(st) != n.key {
			err = errOtherInode
		}
	} else if name, top := n.topName(); top {
		err = n.lstatTop(name, st)
	} else {
		return false, nil
	}
	switch err {
	case unix.ENOENT, unix.ENOTDIR, errOtherInode:
		return true, n.fs.staleErr(n)
	}
	return true, err
}

// errOtherInode: a name leads to another inode than the node's.
var errOtherInode = errors.New("the name leads to another inode")

// lstatTop fills st from one statx of name in SOURCE's top directory, not
// following a symlink, and checks that it is n's inode (errOtherInode if
// not). statTop and the pins (pin.go) check a top-level name with it.
func (n *node) lstatTop(name string, st *inodeStat) error {
	if err := statx(n.fs.rootFd, name, topStatFlags, st); err != nil {
		return err
	}
	if keyOf(st) != n.key {
		return errOtherInode
	}
	return nil
}

// topStatFlags are lstatTop's statx flags. A variable only so that a
// test's control can make it follow a symlink.
var topStatFlags = unix.AT_SYMLINK_NOFOLLOW

// Attr fills a with the backing inode's attributes: those the request
// itself has just read (entryAttr), or fresh ones.
func (n *node) Attr(ctx context.Context, a *fuse.Attr) error {
	if ea, ok := ctx.Value(entryAttrKey{}).(*entryAttr); ok && ea.n == n {
		ea.n = nil
		n.fillAttr(&ea.st, a)
		return nil
	}
	st, err := n.stat()
	if err != nil {
		return n.fs.fail("getattr", n.path(), err)
	}
	n.fillAttr(&st, a)
	return nil
}

// fillAttr fills a from st, the backing inode's attributes, and records
// that the kernel is given them (and, for a regular file, which version
// it may now cache): cache.go. Every answer that carries a node's
// attributes, an entry's included, comes through here.
func (n *node) fillAttr(st *inodeStat, a *fuse.Attr) {
	fillAttr(st, a)
	n.noteGiven(st, n.ftype == unix.S_IFREG)
}

// Attributes of a new entry. bazil answers a request that returns a node
// (lookup, create, mkdir, mknod, symlink, link; readdirplus, once per
// entry, one entry after the other) with that node's
// attributes, which it gets by calling Attr with the request's context,
// right after the handler has read them itself from the inode it returns.
// For those requests the server's WithContext puts an empty entryAttr in
// the context; the handler records the node and its attributes there, and
// Attr answers once from them instead of finding the inode again (an
// openat2, a statx and a close, or a statx on an open handle's
// descriptor). Only the same node, in the same request, takes them.

// entryAttrKey is the context key of a request's *entryAttr.
type entryAttrKey struct{}

// entryAttr is what a request's handler read of the node it returns. It
// is used by the request's own goroutine only.
type entryAttr struct {
	n  *node // nil: none (or already used)
	st inodeStat
}

// returnsEntry reports whether bazil answers req with a node's attributes.
func returnsEntry(req fuse.Request) bool {
	switch req.(type) {
	case *fuse.LookupRequest, *fuse.CreateRequest, *fuse.MkdirRequest,
		*fuse.MknodRequest, *fuse.SymlinkRequest, *fuse.LinkRequest,
		*fuse.ReadDirPlusRequest:
		return true
	}
	return false
}

// withEntryAttr gives a request that returns a node its entryAttr.
func withEntryAttr(ctx context.Context, req fuse.Request) context.Context {
	if !returnsEntry(req) {
		return ctx
	}
	return context.WithValue(ctx, entryAttrKey{}, &entryAttr{})
}

// setEntryAttr records st, just read from n's inode, for the request's
// answer.
func setEntryAttr(ctx context.Context, n passNode, st *inodeStat) {
	if ea, ok := ctx.Value(entryAttrKey{}).(*entryAttr); ok {
		ea.n, ea.st = n.base(), *st
	}
}

// Getattr is Attr for a getattr request.
func (n *node) Getattr(ctx context.Context, req *fuse.GetattrRequest, resp *fuse.GetattrResponse) error {
	return n.Attr(ctx, &resp.Attr)
}

// Setattr changes size, owner, mode and times, in that order (a chown
// clears setuid bits that a following chmod may set again). The kernel has
// checked the caller's permission (default_permissions).
func (n *node) Setattr(ctx context.Context, req *fuse.SetattrRequest, resp *fuse.SetattrResponse) error {
	v := req.Valid
	err := n.withFd(v.Size(), func(fd int) error {
		if n.ftype == unix.S_IFREG {
			var pre, post inodeStat
			if fstat(fd, &pre) != nil {
				defer n.forgetCache()
			} else {
				defer func() {
					if fstat(fd, &post) == nil {
						n.noteChange(&pre, &post)
					} else {
						n.forgetCache()
					}
				}()
			}
		}
		if v.SetattrKillSUIDGID() {
			// A truncate or chown by a caller without CAP_FSETID
			// (setid.go); the reply carries the new mode.
			if _, err := killSetID(fd); err != nil {
				return err
			}
		}
		if v.Size() {
			if err := n.truncate(fd, int64(req.Size)); err != nil {
				return err
			}
		}
		if v.Uid() || v.Gid() {
			uid, gid := -1, -1
			if v.Uid() {
				uid = int(req.Uid)
			}
			if v.Gid() {
				gid = int(req.Gid)
			}
			if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
		}
		if v.Mode() {
			if n.ftype == unix.S_IFLNK {
				return syscall.EOPNOTSUPP
			}
			if err := unix.Chmod(procFdPath(fd), unixPerm(req.Mode)); err != nil {
				return err
			}
		}
		if v.Atime() || v.Mtime() || v.AtimeNow() || v.MtimeNow() {
			ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
			switch {
			case v.AtimeNow():
				ts[0] = unix.Timespec{Nsec: unix.UTIME_NOW}
			case v.Atime():
				ts[0] = unix.NsecToTimespec(req.Atime.UnixNano())
			}
			switch {
			case v.MtimeNow():
				ts[1] = unix.Timespec{Nsec: unix.UTIME_NOW}
			case v.Mtime():
				ts[1] = unix.NsecToTimespec(req.Mtime.UnixNano())
			}
			if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return n.fs.fail("setattr", n.path(), err)
	}
	return nil
}

// truncate sets the size of n, a regular file behind fd, and of its
// shared-memory twin if it has one.
func (n *node) truncate(fd int, size int64) error {
	var t *shmTwin
	if f, ok := n.self.(*File); ok {
		f.mu.Lock()
		t = f.twin
		f.mu.Unlock()
	}
	if t == nil {
		return truncateFd(fd, size)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := truncateFd(fd, size); err != nil {
		return err
	}
	t.truncateLocked(size)
	return nil
}

// truncateFd sets the size of the regular file behind fd.
func truncateFd(fd int, size int64) error {
	err := unix.Ftruncate(fd, size)
	if err == unix.EBADF || err == unix.EINVAL {
		// An O_PATH or read-only descriptor: truncate the inode it names.
		err = unix.Truncate(procFdPath(fd), size)
	}
	return err
}

// Fsync flushes the inode to stable storage. fsync(2) acts on the inode,
// so any descriptor of it does.
func (n *node) Fsync(ctx context.Context, req *fuse.FsyncRequest) error {
	var fd int
	if of := n.borrowOpen(false); of != nil {
		fd = of.fd
		defer n.returnOpen(of)
	} else {
		flags := unix.O_RDONLY | unix.O_NONBLOCK
		if n.ftype == unix.S_IFDIR {
			flags |= unix.O_DIRECTORY
		}
		var err error
		var st inodeStat
		if fd, err = n.openByName(flags, &st); err != nil {
			return n.fs.fail("fsync", n.path(), err)
		}
		defer closeFd(fd)
	}
	var err error
	if req.Flags&1 != 0 {
		err = unix.Fdatasync(fd)
	} else {
		err = unix.Fsync(fd)
	}
	if err != nil {
		return n.fs.fail("fsync", n.path(), err)
	}
	return nil
}
