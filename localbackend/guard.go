package localbackend

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/lockmgr"
)

// GuardTree implements lockmgr.TreeGuard for renaming the directory dir.
//
// Every claim on dir or below it, by any daemon over SOURCE and by any
// program that follows the protocol on SOURCE directly, holds dir's ..LOCK
// (its own or as an ancestor hold), shared at least. So an exclusive flock
// on dir/..LOCK without waiting fails exactly when one is held (ErrBusy),
// and while it is held no new claim there can be granted. If dir has no
// ..LOCK yet, GuardTree creates one (someone may be about to) and removes it
// again in release, while still holding its flock, wherever the rename has
// taken the directory: a claim that opened it meanwhile is granted on a
// removed file and opens the name again (backend.go), so nothing is left.
func (b *Backend) GuardTree(dir string) (release func(), err error) {
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.inflight.Done()
	b.DropKept() // a kept claim is no hold: it must not make the rename busy
	if dir == "." {
		return nil, fmt.Errorf("%w: the root cannot be renamed", lockmgr.ErrInvalid)
	}
	rel, err := backingPath(lockmgr.LockID{Path: dir, Kind: lockmgr.KindDir})
	if err != nil {
		return nil, err
	}
	var dfd int
	err = fdDo(b.src, func(srcFD int) error {
		how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolveSafely}
		var err error
		dfd, err = openat2(srcFD, dir, &how)
		return err
	})
	if err != nil {
		return nil, openError(dir, err)
	}
	created := true
	fd, err := openat2(dfd, dirLockName, &unix.OpenHow{
		Flags: unix.O_RDONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC, Mode: 0o644, Resolve: resolveSafely,
	})
	if errors.Is(err, unix.EEXIST) {
		created = false
		fd, err = openat2(dfd, dirLockName, &unix.OpenHow{
			Flags: unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC, Resolve: resolveSafely,
		})
	}
	if err != nil {
		unix.Close(dfd)
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EROFS) {
			// Nobody can create the file here that we may not: no
			// claim can be held on a file that does not exist.
			return func() {}, nil
		}
		return nil, openError(rel, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		unix.Close(dfd)
		return nil, fmt.Errorf("refusing %s: not a regular file (mode %#o, %v)", rel, st.Mode, err)
	}
	if err := b.flockNB(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		unix.Close(dfd)
		if wouldBlock(err) {
			return nil, fmt.Errorf("%s is flocked: %w", rel, lockmgr.ErrBusy)
		}
		return nil, fmt.Errorf("flock %s: %w", rel, err)
	}
	return func() {
		if created {
			var now unix.Stat_t
			if unix.Fstatat(dfd, dirLockName, &now, unix.AT_SYMLINK_NOFOLLOW) == nil && now.Dev == st.Dev && now.Ino == st.Ino {
				_ = unix.Unlinkat(dfd, dirLockName, 0)
			}
		}
		unix.Close(fd) // releases the flock, after the unlink
		unix.Close(dfd)
	}, nil
}
