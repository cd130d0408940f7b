package localbackend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"syscall"
	"time"

	"github.com/lockfs/lockfs/internal/resolve"
	"github.com/lockfs/lockfs/lockmgr"
	"golang.org/x/sys/unix"
)

// A claim, top down: Claim, claim and claimOnce take the kernel flock on the
// backing file (reusing a kept claim, takeKept below, of the set keep.go
// keeps, or an idle descriptor, idle.go, and waiting in wait.go if the
// flock is held), through the descriptor wrappers near the end of this
// file; unnamed checks that the file locked is still the backing file;
// lease.go wraps it.

// Claim takes the kernel flock on id's backing file in mode, creating the
// file if needed. Without wait it fails with lockmgr.ErrWouldBlock if the
// flock is held in a conflicting mode. With wait it blocks, cancellably,
// until granted or ctx ends (see the package documentation for how). A
// directory that does not exist gives an error wrapping os.ErrNotExist.
func (b *Backend) Claim(ctx context.Context, id lockmgr.LockID, mode lockmgr.Mode, wait bool) (lockmgr.Lease, error) {
	if err := b.enter(); err != nil {
		return nil, fmt.Errorf("claim %s %s: %w", mode, id, err)
	}
	defer b.inflight.Done()

	l, err := b.claim(ctx, id, mode, wait)
	if err != nil {
		return nil, fmt.Errorf("claim %s %s: %w", mode, id, err)
	}
	b.mu.Lock()
	closed := b.closed
	if !closed {
		b.leases[l] = struct{}{}
	}
	b.mu.Unlock()
	if closed {
		l.closeFile()
		return nil, fmt.Errorf("claim %s %s: %w", mode, id, errBackendClosed)
	}
	return l, nil
}

func (b *Backend) claim(ctx context.Context, id lockmgr.LockID, mode lockmgr.Mode, wait bool) (*lease, error) {
	how, err := flockOp(mode)
	if err != nil {
		return nil, err
	}
	rel, err := backingPath(id)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		bk, keptSince, err := b.claimOnce(ctx, id, mode, how, rel, wait)
		if err != nil {
			return nil, err
		}
		f := bk.file
		gone, err := b.unnamed(bk, rel)
		if err == nil && !gone {
			l := newLease(b, id, rel, bk, mode)
			l.keptSince = keptSince
			return l, nil
		}
		// Granted on a file that was removed while we waited or had it
		// open (rmdir through a mount removes the backing files of a
		// directory nobody holds a lock on), or that a rename of its
		// directory took elsewhere (GuardTree): that flock guards
		// nothing of id. Open the name again.
		fdDo(f, func(fd int) error { return b.flockNB(fd, unix.LOCK_UN) })
		f.Close()
		switch {
		case err != nil:
			return nil, fmt.Errorf("stat %s: %w", rel, err)
		case attempt == maxReopen:
			return nil, fmt.Errorf("flock %s: granted on a removed backing file %d times in a row", rel, attempt)
		}
		b.log.WithField("lock", id.String()).Debug("granted on a removed backing file; opening it again")
	}
}

// maxReopen bounds how often one claim opens its backing file again after
// being granted a flock on a removed one.
const maxReopen = 16

// flockOp maps a mode to its flock(2) operation.
func flockOp(mode lockmgr.Mode) (int, error) {
	switch mode {
	case lockmgr.Shared:
		return unix.LOCK_SH, nil
	case lockmgr.Exclusive:
		return unix.LOCK_EX, nil
	}
	return 0, fmt.Errorf("%w: mode %v", lockmgr.ErrInvalid, mode)
}

// backingPath returns the path of id's backing file relative to SOURCE, or an
// error wrapping lockmgr.ErrInvalid if id is malformed.
func backingPath(id lockmgr.LockID) (string, error) {
	if err := id.Check(); err != nil {
		return "", err
	}
	return path.Join(id.Path, BackingName(id.Kind)), nil
}

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

// claimOnce opens (creating if needed) the backing file rel, or reuses a
// kept shared claim of it (keep.go) or an idle descriptor (idle.go), and
// takes the flock how on it, waiting if wait. It returns the open backing
// file, holding the flock, and for a reused kept claim when it was first
// kept.
func (b *Backend) claimOnce(ctx context.Context, id lockmgr.LockID, mode lockmgr.Mode, how int, rel string, wait bool) (backing, time.Time, error) {
	var bk backing
	var reused bool
	if wait {
		if err := b.awaitTurn(ctx, rel); err != nil {
			return backing{}, time.Time{}, err
		}
	}
	if k, locked := b.takeKept(rel, mode == lockmgr.Shared); k != nil {
		if locked {
			return k.backing, k.since, nil // still holds LOCK_SH
		}
		bk, reused = k.backing, true
	} else {
		bk, reused = b.takeIdle(rel)
	}
	if !reused {
		err := fdDo(b.src, func(srcFD int) error {
			var err error
			bk, err = openBacking(srcFD, rel)
			return err
		})
		if err != nil {
			return backing{}, time.Time{}, err
		}
	}
	f := bk.file
	err := fdDo(f, func(fd int) error { return b.flockNB(fd, how) })
	switch {
	case err == nil:
	case !wouldBlock(err):
		f.Close()
		return backing{}, time.Time{}, fmt.Errorf("flock %s: %w", rel, err)
	case !wait:
		f.Close()
		return backing{}, time.Time{}, lockmgr.ErrWouldBlock
	default:
		if err := b.waitFlock(ctx, f, mode, id); err != nil {
			f.Close()
			return backing{}, time.Time{}, err
		}
	}
	return bk, time.Time{}, nil
}

// takeKept removes and returns rel's kept descriptor. If the claim is
// shared and within keepFor, it still holds LOCK_SH and locked is true;
// otherwise it has been unlocked and is reused as an idle descriptor.
func (b *Backend) takeKept(rel string, shared bool) (k *keptFile, locked bool) {
	b.mu.Lock()
	k = b.kept[rel]
	delete(b.kept, rel)
	b.mu.Unlock()
	if k == nil {
		return nil, false
	}
	if shared && time.Since(k.since) < b.keepFor {
		return k, true
	}
	if err := fdDo(k.file, func(fd int) error { return b.flockNB(fd, unix.LOCK_UN) }); err != nil {
		k.file.Close()
		return nil, false
	}
	return k, false
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

// Small wrappers over the system calls the backend makes. Every call on a
// lease's descriptor goes through fdDo, so that a concurrent Release or
// Backend.Close can never close the descriptor, and let the number be reused
// for another file, while a call is using it: os.File defers the real
// close(2) until the last such call returns.

// fdDo runs fn with f's descriptor, or fails with os.ErrClosed if f was
// closed.
func fdDo(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// flockNB applies a non-blocking flock(2) operation (how is LOCK_SH, LOCK_EX
// or LOCK_UN; LOCK_NB is added). It never blocks a thread.
func (b *Backend) flockNB(fd int, how int) error {
	b.flockCalls.Add(1)
	return ignoringEINTR(func() error { return unix.Flock(fd, how|unix.LOCK_NB) })
}

// wouldBlock reports whether err is flock(2)'s "lock is held" answer
// (EWOULDBLOCK, which is EAGAIN on Linux).
func wouldBlock(err error) bool {
	return errors.Is(err, unix.EWOULDBLOCK)
}

// ignoringEINTR retries fn while it fails with EINTR.
func ignoringEINTR(fn func() error) error {
	for {
		err := fn()
		if err != syscall.EINTR {
			return err
		}
	}
}

// unnamed reports whether bk's file is no longer the backing file rel of
// SOURCE: it was removed, or its directory was renamed. Whoever removes a
// backing file (fs/rmdir.go) or renames a directory (GuardTree) holds its
// flock exclusively while doing so, so a flock granted on it was granted
// after the change, and this check, made after the grant, is exact. It
// compares what rel names now with the inode bk opened, which cannot
// change or be reused while bk is open: a removed file is named by
// nothing, so no fstat of bk for its link count is needed.
func (b *Backend) unnamed(bk backing, rel string) (bool, error) {
	var now unix.Stat_t
	err := fdDo(b.src, func(srcFD int) error { return resolve.Lstat(srcFD, rel, resolveSafely, &now) })
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
		return true, nil
	case err != nil:
		return false, err
	}
	return uint64(now.Dev) != bk.dev || now.Ino != bk.ino, nil
}
