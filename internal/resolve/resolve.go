// Package resolve opens paths beneath a directory descriptor with openat2(2)
// whatever their length: a path too long for one system call (PATH_MAX
// counts the whole string) is resolved piece by piece, each piece beneath
// the directory the previous one opened, so a tree deeper than PATH_MAX
// below SOURCE works as it does on a local file system, and every piece
// keeps the caller's RESOLVE_ flags (RESOLVE_BENEATH keeps each piece, and
// so the whole path, beneath the starting directory).
package resolve

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// maxPiece is the longest path given to one openat2 call: well below
// PATH_MAX (4096 bytes with the terminating NUL).
const maxPiece = 2048

// Openat2 opens rel, a slash-separated relative path, beneath dirFd with
// how, as openat2(2) does, retrying EINTR and EAGAIN (which a concurrent
// rename can cause with RESOLVE_BENEATH; retrying is the documented
// answer). A path longer than maxPiece is split at slashes: its leading
// directories are opened O_PATH|O_DIRECTORY|O_NOFOLLOW with how.Resolve,
// one piece at a time, and the rest is opened beneath the last of them.
func Openat2(dirFd int, rel string, how *unix.OpenHow) (int, error) {
	if len(rel) <= maxPiece {
		return openat2(dirFd, rel, how)
	}
	cut := strings.LastIndexByte(rel[:maxPiece+1], '/')
	if cut <= 0 {
		// One name longer than maxPiece: the kernel refuses it
		// (ENAMETOOLONG), as it would on any file system.
		return openat2(dirFd, rel, how)
	}
	dir := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: how.Resolve}
	fd, err := openat2(dirFd, rel[:cut], dir)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fd)
	return Openat2(fd, strings.TrimLeft(rel[cut:], "/"), how)
}

// Lstat fills st for rel beneath dirFd, not following a final symlink,
// whatever rel's length; the directories leading to it are resolved with
// resolveFlags (Openat2).
func Lstat(dirFd int, rel string, resolveFlags uint64, st *unix.Stat_t) error {
	if len(rel) <= maxPiece {
		return ignoringEINTR(func() error { return unix.Fstatat(dirFd, rel, st, unix.AT_SYMLINK_NOFOLLOW) })
	}
	cut := strings.LastIndexByte(rel, '/')
	fd, err := Openat2(dirFd, rel[:cut], &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveFlags,
	})
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return ignoringEINTR(func() error { return unix.Fstatat(fd, rel[cut+1:], st, unix.AT_SYMLINK_NOFOLLOW) })
}

func openat2(dirFd int, rel string, how *unix.OpenHow) (int, error) {
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirFd, rel, how)
		if (err == unix.EAGAIN || err == unix.EINTR) && i < 64 {
			continue
		}
		return fd, err
	}
}

func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}

// Reopen opens the inode behind fd (any descriptor, O_PATH included) anew
// with flags, as a new open file description, through /proc/self/fd/FD,
// retrying EINTR.
func Reopen(fd int, flags int) (int, error) {
	for {
		nfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), flags|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		return nfd, err
	}
}
