package localbackend

import (
	"errors"
	"fmt"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/resolve"
	"github.com/lockfs/lockfs/lockmgr"
)

// Backing file names, one per lock kind, in the locked directory of SOURCE.
// Existing tools of the protocol use the same names on a plain directory.
const (
	dirLockName    = "..LOCK"
	newDirLockName = "..LOCK_NEWDIR"
	usageLockName  = "..LOCK_USAGE"
)

// BackingName returns the name of the hidden file in a directory of SOURCE
// whose kernel flock is the claim on a lock of kind k: "..LOCK",
// "..LOCK_NEWDIR" or "..LOCK_USAGE".
func BackingName(k lockmgr.Kind) string {
	switch k {
	case lockmgr.KindNewDir:
		return newDirLockName
	case lockmgr.KindUsage:
		return usageLockName
	}
	return dirLockName
}

// SourceNames returns the backing file names, which the mount must hide and
// refuse to create (lockmgr.SourceNamer).
func (b *Backend) SourceNames() []string {
	return []string{dirLockName, newDirLockName, usageLockName}
}

// Blocker says who a request waiting for a claim waits for
// (lockmgr.BlockerDescriber): whoever holds the backing file's flock.
func (b *Backend) Blocker() string {
	return "another process or daemon on this host (backing file)"
}

// backingPath returns the path of id's backing file relative to SOURCE, or an
// error wrapping lockmgr.ErrInvalid if id is malformed.
func backingPath(id lockmgr.LockID) (string, error) {
	if err := id.Check(); err != nil {
		return "", err
	}
	return path.Join(id.Path, BackingName(id.Kind)), nil
}

// resolveSafely are the openat2 resolve flags for every backing-file open:
// the path must stay beneath SOURCE and cross no symlink of any kind, so a
// symlink planted in the tree (a directory or the backing file itself) can
// never make the backend create, open or lock a file outside SOURCE.
const resolveSafely = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// backing is an open backing file: the descriptor, whether it is open
// read-write (so NextToken can work), and the inode it opens, which stays
// the same for as long as the descriptor is open.
type backing struct {
	file     *os.File
	writable bool
	dev, ino uint64
}

// openBacking opens (creating if needed) the backing file rel beneath the
// directory srcFD. It falls back to a read-only open of an existing file it
// may not write (the claim still works; tokens do not). The result is a
// regular file with exactly one link: anything else is refused, so a hard
// link planted under a backing name cannot make NextToken overwrite some
// other file.
func openBacking(srcFD int, rel string) (backing, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDWR | unix.O_CREAT | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Mode:    0o644,
		Resolve: resolveSafely,
	}
	fd, err := openat2(srcFD, rel, &how)
	writable := true
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EROFS) {
		how = unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolveSafely}
		if rfd, rerr := openat2(srcFD, rel, &how); rerr == nil {
			fd, err, writable = rfd, nil, false
		}
	}
	if err != nil {
		return backing{}, openError(rel, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return backing{}, fmt.Errorf("stat %s: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		unix.Close(fd)
		return backing{}, fmt.Errorf("refusing %s: not a regular file with one link (mode %#o, %d links)", rel, st.Mode, st.Nlink)
	}
	return backing{file: os.NewFile(uintptr(fd), rel), writable: writable, dev: uint64(st.Dev), ino: st.Ino}, nil
}

// openat2 opens rel beneath dirFD, whatever its length (resolve.Openat2).
func openat2(dirFD int, rel string, how *unix.OpenHow) (int, error) {
	return resolve.Openat2(dirFD, rel, how)
}

// openError explains a failed backing-file open. A missing directory (or a
// file where a directory should be) wraps os.ErrNotExist.
func openError(rel string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("open %s: directory does not exist: %w", rel, err)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("open %s: a path element is not a directory: %w (%w)", rel, os.ErrNotExist, err)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("open %s: path crosses a symlink or leaves SOURCE: %w", rel, err)
	}
	return fmt.Errorf("open %s: %w", rel, err)
}
