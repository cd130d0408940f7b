package filelock

import "sync"

// What a lock request needs of the file it is made on.

// Inode names a backing inode: its device, its inode number and its birth
// time in nanoseconds (0 where the file system has none).
type Inode struct {
	Dev, Ino uint64
	Btime    int64
}

// File is what the locks need of one open regular file of the mount (a
// handle of package fs): locks are taken on its backing file.
type File interface {
	// Inode is the backing inode the file is open on. Locks go by it.
	Inode() Inode
	// UID is the user the file was opened by: a carrier's descriptor is
	// counted for that user as a handle is (Config.TakeFd).
	UID() uint32
	// Path names the file for the log.
	Path() string
	// UseFd calls fn with a descriptor of the backing file: the file's
	// own, or one opened for the call (O_PATH if path).
	UseFd(path bool, fn func(fd int) error) error
	// FlockFd calls fn with the descriptor that carries the file's
	// flock(2) lock; unlock says the call is LOCK_UN.
	FlockFd(unlock bool, fn func(fd int) error) error
	// LockChanged revalidates what the kernel caches of the file after
	// a lock was granted or (unlock) is being released.
	LockChanged(unlock bool)
	// Locks is the file's own lock state (Handle).
	Locks() *Handle
}

// Handle is the lock state of one open file: the byte-range lock owners
// that locked through it, whose carriers its Release closes. The zero
// value is ready to use.
type Handle struct {
	mu sync.Mutex
	// owners are the byte-range lock owners that locked through this
	// handle. GUARDED_BY(mu)
	owners map[*fileLockOwner]struct{}
}
