package fs

import (
	"context"
	"sync"
	"syscall"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/fs/filelock"
	"github.com/lockfs/lockfs/internal/resolve"
)

// File is anything in SOURCE but a directory: a regular file, a symlink, a
// FIFO, a socket or a device. The kernel opens only regular files through
// the daemon; it handles FIFOs and devices itself.
//
// The fields of its own are those only a file that is not a directory
// needs: a host holding many locks has a Dir per held lock, and no File.
type File struct {
	node

	// Mutable state

	// cacheVer is the version of the backing file that the kernel's
	// cached pages of a regular file are no older than, if cacheKnown
	// (cache.go). GUARDED_BY(mu)
	cacheVer   fileVersion
	cacheKnown bool
	// attrVer is the version of the last attributes of a regular file
	// given to the kernel, which may keep them fileAttrValid.
	// GUARDED_BY(mu)
	attrVer fileVersion
	// twin is a shared-memory file's copy of the kernel's cached pages
	// (shm.go), made on first use. GUARDED_BY(mu)
	twin *shmTwin
}

var (
	_ fusefs.Node              = (*File)(nil)
	_ fusefs.NodeGetattrer     = (*File)(nil)
	_ fusefs.NodeSetattrer     = (*File)(nil)
	_ fusefs.NodeOpener        = (*File)(nil)
	_ fusefs.NodeReadlinker    = (*File)(nil)
	_ fusefs.NodeFsyncer       = (*File)(nil)
	_ fusefs.NodeForgetter     = (*File)(nil)
	_ fusefs.NodeGetxattrer    = (*File)(nil)
	_ fusefs.NodeListxattrer   = (*File)(nil)
	_ fusefs.NodeSetxattrer    = (*File)(nil)
	_ fusefs.NodeRemovexattrer = (*File)(nil)
)

// backingOpenFlags keeps the open flags that mean something for the backing
// descriptor, O_NONBLOCK included if the caller asked for it. O_DIRECT is
// dropped: the kernel already bypasses its cache for the caller, and the
// daemon's buffers are not aligned for the backing file system.
func backingOpenFlags(fl fuse.OpenFlags) int {
	const keep = unix.O_ACCMODE | unix.O_APPEND | unix.O_SYNC | unix.O_DSYNC | unix.O_TRUNC | unix.O_NOATIME | unix.O_NONBLOCK
	return int(uint32(fl)) & keep
}

// clearNonblock removes the O_NONBLOCK that guards a backing open of a file
// that may already exist (against a FIFO swapped in by a race) unless the
// caller asked for it. flags are the caller's (backingOpenFlags): F_SETFL
// changes only O_APPEND, O_ASYNC, O_DIRECT, O_NOATIME and O_NONBLOCK, and
// fd was opened with those of flags and no others but O_NONBLOCK, so
// setting flags restores exactly what the caller asked for, with no F_GETFL
// first.
func clearNonblock(fd int, flags int) error {
	if flags&unix.O_NONBLOCK != 0 {
		return nil
	}
	_, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags)
	return err
}

// Open opens the file by one of its names, or, when it has none left (it
// was unlinked while open elsewhere), through an open handle's descriptor.
func (n *File) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fusefs.Handle, error) {
	if n.ftype != unix.S_IFREG {
		return nil, n.fs.fail("open", n.path(), syscall.EINVAL)
	}
	if err := n.fs.takeHandle("open", n.path, req.Uid); err != nil {
		return nil, err
	}
	opened := false
	defer func() {
		if !opened {
			n.fs.handles.give(req.Uid)
		}
	}()
	want := backingOpenFlags(req.Flags)
	flags := want | unix.O_NONBLOCK
	var st inodeStat
	fd, err := n.openByName(flags, &st)
	if err != nil && n.replaced() {
		// A name of n now leads to another file (replaced in SOURCE
		// behind the kernel's cache, which keeps attributes and names
		// for a second): ESTALE makes the kernel look the name up again
		// and open what is there now, not the old inode through a handle
		// still open on it.
		return nil, n.fs.fail("open", n.path(), err)
	}
	if err != nil {
		of := n.borrowOpen(false)
		if of == nil {
			return nil, n.fs.fail("open", n.path(), err)
		}
		fd, err = resolve.Reopen(of.fd, flags)
		n.returnOpen(of)
		if err == nil {
			if err = fstat(fd, &st); err != nil {
				closeFd(fd)
			}
		}
		if err != nil {
			return nil, n.fs.fail("open", n.path(), err)
		}
	}
	if err := clearNonblock(fd, want); err != nil {
		closeFd(fd)
		return nil, n.fs.fail("open", n.path(), err)
	}
	h := n.newHandle(fd, flags, &st, req.Uid)
	opened = true
	h.answerOpen(&st, resp)
	return h, nil
}

// answerOpen completes the answer to the open (or create) of the new
// handle h of the file whose attributes are st: the kernel's cache
// (cache.go), FUSE passthrough (passthrough.go), then detaching the
// handle from its descriptor (detach.go).
func (h *fileHandle) answerOpen(st *inodeStat, resp *fuse.OpenResponse) {
	keep, grown := h.n.openCache(st, h.shared)
	if keep {
		resp.Flags |= fuse.OpenKeepCache
	}
	h.n.fs.openPassthrough(h, st, resp)
	if grown {
		h.openGrown(st)
	}
	h.detach()
}

// replaced reports whether one of n's names still exists in SOURCE (its
// inode then is another one: openByName failed).
func (n *File) replaced() bool {
	for _, p := range n.paths() {
		fd, err := openBeneath(n.fs.rootFd, p, unix.O_PATH|unix.O_NOFOLLOW, 0)
		if err == nil {
			closeFd(fd)
			return true
		}
	}
	return false
}

// newHandle wraps a backing descriptor of a regular file, opened with
// flags, as an open handle of n, counted for uid (handleCap); st is the
// inode's attributes, taken from fd.
func (n *File) newHandle(fd, flags int, st *inodeStat, uid uint32) *fileHandle {
	of := &openFile{fd: fd, write: flags&unix.O_ACCMODE != unix.O_RDONLY, uid: uid}
	h := &fileHandle{n: n, key: keyOf(st), of: of, flags: flags, shared: n.isSharedMemory()}
	n.addOpen(h.of)
	return h
}

// Readlink returns a symlink's target.
func (n *File) Readlink(ctx context.Context, req *fuse.ReadlinkRequest) (string, error) {
	var target string
	err := n.withFd(false, func(fd int) error {
		for size := 256; ; size *= 2 {
			buf := make([]byte, size)
			got, err := unix.Readlinkat(fd, "", buf)
			if err != nil {
				return err
			}
			if got < size {
				target = string(buf[:got])
				return nil
			}
		}
	})
	if err != nil {
		return "", n.fs.fail("readlink", n.path(), err)
	}
	return target, nil
}

// linkInto makes name in directory dirFd a new link to n's inode. As root
// it links the exact inode behind a descriptor (AT_EMPTY_PATH needs
// CAP_DAC_READ_SEARCH); otherwise it links one of n's names, checked first.
func (n *File) linkInto(dirFd int, name string) error {
	if n.fs.asRoot {
		return n.withFd(false, func(fd int) error {
			return unix.Linkat(fd, "", dirFd, name, unix.AT_EMPTY_PATH)
		})
	}
	n.fs.treeMu.RLock()
	links := append([]link(nil), n.links...)
	n.fs.treeMu.RUnlock()
	for _, l := range links {
		err := l.dir.at(func(oldFd int, _ *inodeStat) error {
			var st inodeStat
			if err := lstatAt(oldFd, l.name, &st); err != nil {
				return err
			}
			if keyOf(&st) != n.key {
				return syscall.ENOENT
			}
			return unix.Linkat(oldFd, l.name, dirFd, name, 0)
		})
		if err == nil || (err != unix.ENOENT && err != syscall.ESTALE) {
			return err
		}
	}
	return syscall.ESTALE
}

// fileHandle is one open file description of a regular file: its own
// backing open file description, which also carries its flock(2) lock.
type fileHandle struct {
	// Dependencies
	n *File

	// Constant data

	// of is the handle's backing descriptor; its fd is -1 once the
	// handle is detached (detach.go: set before the handle is answered).
	of *openFile
	// flags are the backing open flags (backingOpenFlags), for the
	// descriptors a detached handle opens.
	flags int
	// key is the backing inode behind of (n's). Locks go by it.
	key inodeKey
	// shared is set if the file is a shared-memory file (cache.go), by
	// its name when opened.
	shared bool
	// io is how the kernel opened it: for passthrough or not
	// (passthrough.go). Set before the handle is answered.
	io ioMode

	// Mutable state

	// flockMu guards flockOf and is held across flock(2) on it.
	flockMu sync.Mutex
	// flockOf carries a detached handle's flock(2) lock (detach.go).
	// GUARDED_BY(flockMu)
	flockOf *openFile

	// locks are the byte-range lock owners that locked through this
	// handle (package filelock).
	locks filelock.Handle
}

var (
	_ fusefs.HandleReader      = (*fileHandle)(nil)
	_ fusefs.HandleWriter      = (*fileHandle)(nil)
	_ fusefs.HandleFlusher     = (*fileHandle)(nil)
	_ fusefs.HandleReleaser    = (*fileHandle)(nil)
	_ fusefs.HandleFAllocater  = (*fileHandle)(nil)
	_ fusefs.HandleLseeker     = (*fileHandle)(nil)
	_ fusefs.HandleFlockLocker = (*fileHandle)(nil)
	_ fusefs.HandlePOSIXLocker = (*fileHandle)(nil)
	_ fusefs.HandlePoller      = (*fileHandle)(nil)
)

// spliceReadMin is the smallest read answered by splice(2) rather than
// pread: below it, the copy that splice saves costs less than its third
// system call.
const spliceReadMin = 32 << 10

// Read reads at an offset; a short result means end of file.
func (h *fileHandle) Read(ctx context.Context, req *fuse.ReadRequest, resp *fuse.ReadResponse) error {
	if h.shared {
		t := h.n.twinOf()
		t.mu.Lock()
		defer t.mu.Unlock()
		if err := h.read(h.of.fd, req, resp); err != nil {
			return err
		}
		t.recordLocked(req.Offset, resp.Data, len(resp.Data) < req.Size)
		return nil
	}
	if h.of.fd < 0 {
		// A detached handle, whose reads the kernel makes itself.
		return h.detachedIO("read", func(fd int) error { return h.read(fd, req, resp) })
	}
	if req.Size >= spliceReadMin && h.n.fs.cfg.SpliceReads {
		// The fork moves the data from SOURCE's page cache into the
		// reply (fuse.ReadSplice), or preads them if it cannot. The
		// descriptor stays open until the reply is out: the kernel
		// sends RELEASE only after the reads of the file are answered.
		resp.Splice = &fuse.ReadSplice{FD: h.of.fd, Failed: func(err error) error {
			return h.n.fs.fail("read", h.n.path(), err)
		}}
		return nil
	}
	return h.read(h.of.fd, req, resp)
}

// read reads from fd into resp.Data.
func (h *fileHandle) read(fd int, req *fuse.ReadRequest, resp *fuse.ReadResponse) error {
	buf := resp.Data[:req.Size]
	done := 0
	for done < len(buf) {
		got, err := unix.Pread(fd, buf[done:], req.Offset+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return h.n.fs.fail("read", h.n.path(), err)
		}
		if got == 0 {
			break
		}
		done += got
	}
	resp.Data = buf[:done]
	return nil
}

// Lseek answers SEEK_DATA and SEEK_HOLE from the backing file, so that
// sparse files show their holes as on SOURCE. The handle's descriptor is
// only ever used at explicit offsets, so moving its offset is harmless.
func (h *fileHandle) Lseek(ctx context.Context, req *fuse.LseekRequest, resp *fuse.LseekResponse) error {
	var off int64
	err := h.useFd(false, func(fd int) (err error) {
		off, err = unix.Seek(fd, req.Offset, req.Whence)
		return err
	})
	if err != nil {
		if err == unix.ENXIO {
			return err // past the last data or hole: not a failure
		}
		return h.n.fs.fail("lseek", h.n.path(), err)
	}
	resp.Offset = off
	return nil
}

// Flush is sent at every close(2) of a descriptor of the file: POSIX record
// locks of the closing process end (package filelock).
func (h *fileHandle) Flush(ctx context.Context, req *fuse.FlushRequest) error {
	if h.shared {
		h.lockCache(true) // its POSIX locks end: as an unlock
	}
	h.n.fs.locks.Flush(h.key.lockInode(), req.LockOwner)
	return nil
}

// Release ends the open file description: its flock lock and its OFD locks
// end with it.
func (h *fileHandle) Release(ctx context.Context, req *fuse.ReleaseRequest) error {
	h.n.fs.locks.Release(h.locker(), req.LockOwner)
	h.closeFlockFd()
	h.n.fs.releasePassthrough(h)
	h.releaseDetached()
	h.n.releaseOpen(h.of)
	return nil
}

// Poll answers ENOSYS: regular files are always ready, and ENOSYS tells the
// kernel never to ask again on this mount. Go programs register every file
// they open with epoll, which makes the kernel ask; the first answer stops
// that. (A Go process that serves the mount and opens files on it itself
// could otherwise deadlock: the runtime makes that epoll_ctl call without
// releasing its P.)
func (h *fileHandle) Poll(ctx context.Context, req *fuse.PollRequest, resp *fuse.PollResponse) error {
	return syscall.ENOSYS
}
