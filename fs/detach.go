package fs

import (
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/resolve"
)

// Handles that keep no descriptor.
//
// A handle opened for FUSE passthrough (passthrough.go) needs no backing
// descriptor of the daemon for its reads, writes and mappings: the kernel
// keeps the backing file it was given at the open (the registration's
// file, referenced by every open that named its backing id, for as long
// as that open lasts) and uses it itself. So, where the daemon can find
// the exact inode again without a name, a passthrough handle closes its
// descriptor as soon as the open is answered ("detached") and the open
// costs the daemon nothing: a process meets its own RLIMIT_NOFILE first,
// as on a local file system, and the per-uid cap (fdcap.go) counts only
// the descriptors the daemon really holds. What still needs a descriptor
// gets one:
//
//   - a flock(2) lock: a description of the handle's own, opened at the
//     first lock, counted for the handle's user, closed at LOCK_UN or
//     Release (flockFd);
//   - byte-range locks: their carriers (package filelock) are descriptors of
//     their own anyway, counted, closed at Flush and Release;
//   - a request that reaches the daemon with the handle (fallocate,
//     lseek, F_GETLK, a read or write that is not passed through) or with
//     its node (getattr, setattr, fsync, xattrs of a file with no name
//     left): a descriptor for the request's duration, as a lookup takes.
//
// The inode is found again by its file handle (name_to_handle_at(2), kept
// per node, opened with open_by_handle_at(2), which finds an unlinked file
// too for as long as anything holds it open, the kernel's backing file
// included). That needs CAP_DAC_READ_SEARCH and a SOURCE whose file
// system has file handles (ext4, xfs, btrfs, tmpfs, overlayfs...): without
// them, and for files on another file system mounted beneath SOURCE, every
// handle keeps its descriptor as without passthrough.

// byHandle opens inodes of SOURCE by file handle.
type byHandle struct {
	// mountFd is a descriptor of SOURCE's root that open_by_handle_at
	// accepts (not O_PATH); mountID is its mount's id.
	mountFd int
	mountID int
}

// newByHandle returns SOURCE's by-handle opener, or nil and the reason
// why inodes cannot be opened so.
func newByHandle(source string, rootFd int) (*byHandle, string) {
	h, id, err := unix.NameToHandleAt(rootFd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return nil, "name_to_handle_at: " + unix.ErrnoName(errnoOf(err)) + " (SOURCE's file system has no file handles)"
	}
	fd, err := unix.Open(source, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "open SOURCE: " + unix.ErrnoName(errnoOf(err))
	}
	probe, err := unix.OpenByHandleAt(fd, h, unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		closeFd(fd)
		return nil, "open_by_handle_at: " + unix.ErrnoName(errnoOf(err)) + " (needs CAP_DAC_READ_SEARCH)"
	}
	closeFd(probe)
	return &byHandle{mountFd: fd, mountID: id}, ""
}

// OpenFilesCostNothing reports whether a passthrough open through a mount
// of source would cost the daemon no descriptor (its inodes can be
// opened by file handle, with this process's capabilities), and if not,
// why, for lockfs doctor. It says nothing of passthrough itself.
func OpenFilesCostNothing(source string) (bool, string) {
	rootFd, err := unix.Open(source, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, "open SOURCE: " + unix.ErrnoName(errnoOf(err))
	}
	defer closeFd(rootFd)
	b, why := newByHandle(source, rootFd)
	b.close()
	return b != nil, why
}

// close closes the opener's descriptor.
func (b *byHandle) close() {
	if b != nil {
		closeFd(b.mountFd)
	}
}

// open opens the inode named by h with flags.
func (b *byHandle) open(h unix.FileHandle, flags int) (int, error) {
	for {
		fd, err := unix.OpenByHandleAt(b.mountFd, h, flags|unix.O_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// detach closes h's descriptor if h can do without it (see the top of the
// file). Call it last in Open and Create, before the handle is answered:
// nothing else knows h yet.
func (h *fileHandle) detach() {
	n, b := h.n, h.n.fs.byHandle
	if b == nil || h.io != ioPassthrough || h.shared {
		return
	}
	fh, opens, ok := b.handleOf(&n.node, h.of.fd)
	if !ok {
		return // another file system beneath SOURCE: kept
	}
	if !opens {
		// Some file systems encode handles they cannot open (overlayfs
		// without nfs_export): try this one once (the registration of
		// the inode as a backing file, backingFd, usually has).
		fd, err := b.open(fh, unix.O_PATH)
		if err != nil {
			return
		}
		closeFd(fd)
	}
	old := h.of
	h.of = &openFile{fd: -1, write: old.write, uid: old.uid}
	n.mu.Lock()
	n.fh, n.fhOK = fh, true
	n.detached++
	n.mu.Unlock()
	n.releaseOpen(old)
}

// handleOf returns n's file handle and whether it is known to open; if n
// has none that opens yet, the handle of fd, a descriptor of n's inode
// (name_to_handle_at). ok is false if fd's file is on another file system
// mounted beneath SOURCE.
func (b *byHandle) handleOf(n *node, fd int) (fh unix.FileHandle, opens, ok bool) {
	n.mu.Lock()
	fh, opens = n.fh, n.fhOK
	n.mu.Unlock()
	if opens {
		return fh, true, true
	}
	fh, id, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	if err != nil || id != b.mountID {
		return unix.FileHandle{}, false, false
	}
	return fh, false, true
}

// backingFd opens the descriptor that registers h's inode as a backing
// file (passthrough.go), read-only: by the node's file handle where h may
// be detached, which also proves once that the handle opens, so that
// detach need not try it; else, or if that fails, by reopening h's own
// descriptor through /proc. Either costs one open: the by-handle one saves
// detach an open and a close.
func (h *fileHandle) backingFd() (int, error) {
	const flags = unix.O_RDONLY | unix.O_NONBLOCK
	n, b := h.n, h.n.fs.byHandle
	if b != nil && !h.shared {
		if fh, opens, ok := b.handleOf(&n.node, h.of.fd); ok {
			if fd, err := b.open(fh, flags); err == nil {
				if !opens {
					n.mu.Lock()
					n.fh, n.fhOK = fh, true
					n.mu.Unlock()
				}
				return fd, nil
			}
		}
	}
	return resolve.Reopen(h.of.fd, flags)
}

// releaseDetached ends a detached handle's part in its node.
func (h *fileHandle) releaseDetached() {
	if h.of.fd >= 0 {
		return
	}
	h.n.mu.Lock()
	h.n.detached--
	h.n.mu.Unlock()
}

// openDetached opens n's inode by its file handle if n has detached
// handles (for writing if write is set and it can be, else for reading,
// else O_PATH), as an openFile released at once, which its borrower's
// returnOpen closes; nil if n has none or the open failed.
func (n *node) openDetached(write bool) *openFile {
	b := n.fs.byHandle
	n.mu.Lock()
	fh, ok := n.fh, n.fhOK && n.detached > 0
	n.mu.Unlock()
	if b == nil || !ok {
		return nil
	}
	modes := []int{unix.O_RDONLY, unix.O_PATH}
	if write {
		modes = []int{unix.O_RDWR, unix.O_RDONLY, unix.O_PATH}
	}
	for _, m := range modes {
		if m != unix.O_PATH {
			m |= unix.O_NONBLOCK | unix.O_NOCTTY
		}
		fd, err := b.open(fh, m)
		if err == nil {
			return &openFile{fd: fd, write: write && m&unix.O_ACCMODE == unix.O_RDWR, released: true, borrowers: 1}
		}
		if err != unix.EACCES && err != unix.EPERM && err != unix.ETXTBSY {
			n.fs.fail("open_by_handle_at", n.path(), err)
			return nil
		}
	}
	return nil
}

// useFd calls fn with a descriptor of h's file: h's own, or, for a
// detached handle, one opened for the call with h's access mode and
// O_APPEND (O_PATH if path is set, for fstat).
func (h *fileHandle) useFd(path bool, fn func(fd int) error) error {
	if h.of.fd >= 0 {
		return fn(h.of.fd)
	}
	fd, err := h.openOwn(path)
	if err != nil {
		return err
	}
	defer closeFd(fd)
	return fn(fd)
}

// detachedIO calls fn, a read or write that reached the daemon, with a
// descriptor opened for it (useFd's), logging a failure to open as op's;
// fn logs its own.
func (h *fileHandle) detachedIO(op string, fn func(fd int) error) error {
	fd, err := h.openOwn(false)
	if err != nil {
		return h.n.fs.fail(op, h.n.path(), err)
	}
	defer closeFd(fd)
	return fn(fd)
}

// openOwn opens a new description of a detached handle's inode with the
// handle's flags (O_PATH if path is set).
func (h *fileHandle) openOwn(path bool) (int, error) {
	n := h.n
	n.mu.Lock()
	fh := n.fh
	n.mu.Unlock()
	flags := unix.O_PATH
	if !path {
		flags = h.flags&(unix.O_ACCMODE|unix.O_APPEND|unix.O_SYNC|unix.O_DSYNC) | unix.O_NONBLOCK | unix.O_NOCTTY
	}
	return n.fs.byHandle.open(fh, flags)
}

// flockFd calls fn with the descriptor that carries h's flock(2) lock:
// h's own, or for a detached handle one opened for it at the first lock
// and kept until unlock (closed after fn if unlock, or if fn failed on a
// descriptor opened for it: no lock on it) or Release. It is
// counted for h's user (at the cap: ENOLCK) and lent to its node's
// metadata requests as a handle's descriptor is. h.flockMu is held across
// fn, so that a concurrent unlock cannot close the descriptor under a lock.
func (h *fileHandle) flockFd(unlock bool, fn func(fd int) error) error {
	if h.of.fd >= 0 {
		return fn(h.of.fd)
	}
	h.flockMu.Lock()
	defer h.flockMu.Unlock()
	fresh := h.flockOf == nil
	if fresh {
		if unlock {
			return nil // nothing held
		}
		f := h.n.fs
		if err := f.takeHandle("flock", h.n.path, h.of.uid); err != nil {
			return syscall.ENOLCK
		}
		fd, err := h.openOwn(false)
		if err != nil {
			f.handles.give(h.of.uid)
			return err
		}
		h.flockOf = &openFile{fd: fd, write: h.of.write, uid: h.of.uid}
		h.n.addOpen(h.flockOf)
	}
	err := fn(h.flockOf.fd)
	if unlock || (fresh && err != nil) {
		h.closeFlockFdLocked()
	}
	return err
}

// closeFlockFd closes a detached handle's flock descriptor, if any: its
// lock ends.
func (h *fileHandle) closeFlockFd() {
	if h.of.fd >= 0 {
		return
	}
	h.flockMu.Lock()
	defer h.flockMu.Unlock()
	h.closeFlockFdLocked()
}

// closeFlockFdLocked is closeFlockFd with h.flockMu held.
func (h *fileHandle) closeFlockFdLocked() {
	if h.flockOf != nil {
		h.n.releaseOpen(h.flockOf)
		h.flockOf = nil
	}
}
