package fs

import (
	"fmt"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/logs"
	"github.com/lockfs/lockfs/internal/resolve"
)

// Safety: every backing operation resolves beneath SOURCE.
//
// A path relative to SOURCE is opened with openat2(2) from f.rootFd with
// RESOLVE_BENEATH (no component may leave the starting directory, ".." and
// absolute symlinks included), RESOLVE_NO_SYMLINKS (no symlink is followed
// anywhere in the path: the kernel follows symlinks of the mount itself, so
// a symlink in a backing path can only be a race, and is refused with
// ELOOP) and RESOLVE_NO_MAGICLINKS, and always with O_NOFOLLOW, which with
// O_PATH yields the final symlink itself. Operations on a name are then
// made relative to the directory descriptor so obtained (mkdirat, unlinkat,
// renameat, symlinkat, linkat, fstatat with AT_SYMLINK_NOFOLLOW), and
// operations on an inode act on a descriptor of that inode: fstat,
// fchownat(AT_EMPTY_PATH), utimensat(AT_EMPTY_PATH), or the path
// /proc/self/fd/N, which names exactly the inode behind our own descriptor N
// and is not followed any further (chmod, truncate, *xattr).

// resolveBeneath is the resolution every backing path gets.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openBeneath opens rel, a slash-separated path relative to the directory
// dirFd (f.rootFd for paths relative to SOURCE), never leaving it and never
// following a symlink. O_CLOEXEC and O_NOFOLLOW are always added; mode
// matters only with O_CREAT.
func openBeneath(dirFd int, rel string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: resolveBeneath,
	}
	if flags&(unix.O_CREAT|unix.O_TMPFILE) != 0 {
		how.Mode = uint64(mode)
	}
	// A path longer than one call takes (a tree deeper than PATH_MAX)
	// is resolved piece by piece, each beneath the last (resolve).
	return resolve.Openat2(dirFd, rel, &how)
}

// procFdPath names the inode behind our own descriptor fd. Path-based calls
// on it follow the magic link to exactly that inode and no further.
func procFdPath(fd int) string {
	return fmt.Sprintf("/proc/self/fd/%d", fd)
}

// checkName refuses names the kernel never sends; they would let a path
// escape its directory or name several components.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || strings.ContainsRune(name, 0) {
		return syscall.EINVAL
	}
	return nil
}

// joinRel joins a directory path ("." for the root) and a name.
func joinRel(dir, name string) string {
	if dir == "." || dir == "" {
		return name
	}
	return dir + "/" + name
}

// closeFd closes a descriptor whose close cannot report anything useful
// (O_PATH descriptors, read-only ones, duplicates).
func closeFd(fd int) {
	if fd >= 0 {
		_ = unix.Close(fd)
	}
}

// Errors. Every failed request is logged here once, with its op and path,
// at the level it deserves, and the errno is returned for bazil to answer
// with.

// routine are errnos that ordinary programs provoke all the time (a lookup
// of a name that does not exist, a non-blocking lock that is busy...).
var routine = map[syscall.Errno]bool{
	syscall.ENOENT: true, syscall.EEXIST: true, syscall.ENOTEMPTY: true,
	syscall.ENODATA: true, syscall.EAGAIN: true, syscall.EINTR: true,
	syscall.ENOTDIR: true, syscall.EISDIR: true, syscall.ERANGE: true,
	syscall.ESTALE: true, syscall.ENAMETOOLONG: true, syscall.EACCES: true,
	syscall.EPERM: true, syscall.EOPNOTSUPP: true, syscall.EINVAL: true,
	syscall.EXDEV: true, syscall.EBUSY: true, syscall.ETXTBSY: true,
	syscall.EMLINK: true, syscall.E2BIG: true, syscall.EFBIG: true,
}

// fail logs a failed backing operation and returns its errno.
func (f *FS) fail(op, path string, err error) error {
	errno := errnoOf(err)
	if routine[errno] && !logs.DebugEnabled(f.log) {
		// Every create of a new name fails a lookup first. Building a
		// log entry that nobody keeps took nine allocations, and 5 % of
		// the samples of bench's cpu-meta profile.
		return errno
	}
	e := f.log.WithFields(logrus.Fields{"op": op, "path": path, "errno": unix.ErrnoName(errno)})
	switch {
	case errno == syscall.ELOOP:
		// A symlink appeared inside a backing path: something in SOURCE
		// changed under the mount (or tried to lead it outside).
		e.Info("symlink in backing path refused")
	case errno == syscall.ENODATA:
		// An absent extended attribute is an answer, not a failure: the
		// kernel asks for security.capability before every write.
		e.Trace("no such attribute")
	case routine[errno]:
		e.Debug("request failed")
	default:
		e.WithError(err).Warn("request failed")
	}
	return errno
}

// refuse logs a request refused by lockfs's own rules (reserved names,
// sticky directories) and returns errno.
func (f *FS) refuse(op, path string, errno syscall.Errno, why string) error {
	f.log.WithFields(logrus.Fields{"op": op, "path": path, "errno": unix.ErrnoName(errno)}).Info("request refused: " + why)
	return errno
}
