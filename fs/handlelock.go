package fs

import (
	"context"

	"bazil.org/fuse"

	"github.com/lockfs/lockfs/fs/filelock"
)

// Locks on ordinary files: the flock(2) and fcntl(2) requests on a regular
// file's handle are package filelock's, which applies them to the backing
// file in the host kernel. A handle is a filelock.File through
// lockedFile, a view of it that gives filelock what it asks and nothing
// more.

// Lock takes a lock without waiting (LOCK_NB, F_SETLK).
func (h *fileHandle) Lock(ctx context.Context, req *fuse.LockRequest) error {
	return h.n.fs.locks.Lock(h.locker(), req)
}

// LockWait takes a lock, waiting until it is free or ctx ends (EINTR).
func (h *fileHandle) LockWait(ctx context.Context, req *fuse.LockWaitRequest) error {
	return h.n.fs.locks.LockWait(ctx, h.locker(), req)
}

// Unlock releases a lock or part of a byte range.
func (h *fileHandle) Unlock(ctx context.Context, req *fuse.UnlockRequest) error {
	return h.n.fs.locks.Unlock(h.locker(), req)
}

// QueryLock answers F_GETLK: a lock that would conflict with the request,
// as the backing file's lock table sees it from the requesting owner.
func (h *fileHandle) QueryLock(ctx context.Context, req *fuse.QueryLockRequest, resp *fuse.QueryLockResponse) error {
	return h.n.fs.locks.QueryLock(h.locker(), req, resp)
}

// lockedFile is a fileHandle as package filelock sees it.
type lockedFile fileHandle

var _ filelock.File = (*lockedFile)(nil)

// locker returns h as a filelock.File.
func (h *fileHandle) locker() *lockedFile { return (*lockedFile)(h) }

// lockInode is the inode key in filelock's form.
func (k inodeKey) lockInode() filelock.Inode {
	return filelock.Inode{Dev: k.dev, Ino: k.ino, Btime: k.btime}
}

// Inode is the backing inode behind the handle.
func (l *lockedFile) Inode() filelock.Inode { return l.key.lockInode() }

// UID is the user the handle is counted for (handleCap).
func (l *lockedFile) UID() uint32 { return l.of.uid }

// Path names the file for the log.
func (l *lockedFile) Path() string { return l.n.path() }

// UseFd calls fn with the handle's descriptor or one opened for the call
// (detach.go).
func (l *lockedFile) UseFd(path bool, fn func(fd int) error) error {
	return (*fileHandle)(l).useFd(path, fn)
}

// FlockFd calls fn with the descriptor that carries the handle's flock
// (detach.go).
func (l *lockedFile) FlockFd(unlock bool, fn func(fd int) error) error {
	return (*fileHandle)(l).flockFd(unlock, fn)
}

// LockChanged revalidates the kernel's cache of the file (cache.go).
func (l *lockedFile) LockChanged(unlock bool) { (*fileHandle)(l).lockCache(unlock) }

// Locks is the handle's own lock state.
func (l *lockedFile) Locks() *filelock.Handle { return &l.locks }
