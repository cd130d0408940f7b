package fs

import (
	"context"
	"errors"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/resolve"
)

// Removing a directory that holds nothing but backing files.
//
// The local backend keeps each lock as a flock on a backing file (..LOCK,
// ..LOCK_NEWDIR, ..LOCK_USAGE) in the locked directory of SOURCE and never
// removes it. The mount hides those names, so a directory that was ever
// locked looks empty, and rmdir(2) through the mount must remove it as it
// would an empty directory. When rmdir of the backing directory fails with
// ENOTEMPTY, removeBackingFiles looks at what it holds: if only backing
// files, and nobody holds a flock on any of them, it removes them and the
// rmdir is made again, once.
//
// Every backing file is flocked LOCK_EX|LOCK_NB before any is unlinked, and
// unlinked while that flock is held, so:
//
//   - a lock held on the directory by anyone (this daemon, another lockfs
//     daemon over SOURCE, a program locking SOURCE directly) makes the
//     rmdir fail with EBUSY, and nothing is removed;
//   - whoever is granted a flock on an unlinked backing file is granted it
//     after the unlink, and can tell (its link count is 0): the local
//     backend checks that after every grant and opens the name again.
//
// A program that locks SOURCE directly with flock(1) does not check: if it
// opened a backing file just before the unlink and flocks it just after,
// it holds a flock on a file nobody else can find. That is the ordinary
// hazard of removing a lock file, and the reason rmdir does this only for a
// directory nobody holds a lock on.
//
// Removing the backing files removes their fencing-token counters too: a
// directory made again under the same name starts its tokens from 1.

// errLockHeld means that a backing file of the directory to remove is
// flocked by someone: a lock on the directory is held.
var errLockHeld = errors.New("a lock on the directory is held")

// errNotBackingFile means that a backing name in the directory to remove is
// not a regular file: not a lock file, so not lockfs's to remove.
var errNotBackingFile = errors.New("a backing name is not a regular file")

// backingRefusal is the errno and reason that rmdir and rename answer for
// removeBackingFiles' own verdicts; ok is false for any other error.
func backingRefusal(err error) (errno syscall.Errno, why string, ok bool) {
	switch err {
	case errLockHeld:
		return syscall.EBUSY, "a lock on the directory is held", true
	case errNotBackingFile:
		return syscall.ENOTEMPTY, "a backing name in the directory is not a lock file", true
	}
	return 0, "", false
}

// removeBackingFiles removes the backing files of the directory name in
// dirFd, whose attributes were st, if they are its only entries and nobody
// holds a flock on any of them. It returns nil when the rmdir is worth
// trying again, ENOTEMPTY when the directory holds anything else (nothing
// is removed then), errLockHeld or errNotBackingFile (nothing is removed
// either), or the error of a backing operation. parent is the relative
// path of the directory dirFd is open at, and tid the caller: a lock on
// the directory that came to the caller's lineage with the parent's
// exclusive new-dir lock (lockmgr.GiveUpAdopted) is given up first, so
// that a creator may remove what it made under that lock.
func (f *FS) removeBackingFiles(dirFd int, parent, name string, st *inodeStat, tid int) (err error) {
	fd, err := openBeneath(dirFd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer closeFd(fd)
	names, err := f.backingNamesOnly(fd, st)
	if err != nil {
		return err
	}

	// The caller's own adopted lock is not in the way (see above). The
	// backend's claims kept after their release are no hold: have them
	// dropped, so that only real holds make the rmdir busy.
	if f.giveUpAdopted(parent, name, tid) {
		defer func() {
			if err != nil {
				// Not removed after all: the creator keeps its lock.
				f.readopt(parent, name, tid)
			}
		}()
	}
	if f.cfg.Engine != nil {
		f.cfg.Engine.DropKeptClaims()
	}
	// Lock every backing file first, so that a busy one leaves all of
	// them in place.
	locked, err := lockBackingFiles(fd, names)
	defer func() {
		for _, h := range locked {
			closeFd(h.fd) // releases the flock, after the unlink
		}
	}()
	if err != nil {
		return err
	}
	return unlinkHeld(fd, locked)
}

// backingNamesOnly returns the names in the directory fd, which must still
// be the inode st, if they are all backing files; ENOTEMPTY if one is not,
// or if the directory was replaced since the rmdir looked.
func (f *FS) backingNamesOnly(fd int, st *inodeStat) ([]string, error) {
	var dst inodeStat
	if err := fstat(fd, &dst); err != nil {
		return nil, err
	}
	if keyOf(&dst) != keyOf(st) {
		// Replaced since the rmdir looked: leave the newcomer alone.
		return nil, unix.ENOTEMPTY
	}
	names, err := readNames(fd)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if !f.isBacking(n) {
			return nil, unix.ENOTEMPTY
		}
	}
	return names, nil
}

// heldBacking is a backing file opened and flocked for its removal.
type heldBacking struct {
	name string
	fd   int
	key  inodeKey
}

// lockBackingFiles opens and flocks (LOCK_EX|LOCK_NB) each of names in the
// directory fd; errLockHeld if one is held. It returns what it opened
// even when it fails: the caller closes every descriptor, which releases
// its flock.
func lockBackingFiles(fd int, names []string) ([]heldBacking, error) {
	var locked []heldBacking
	for _, n := range names {
		bfd, key, err := openLockFile(fd, n)
		if err == unix.ENOENT {
			continue // gone meanwhile
		}
		if err != nil {
			return locked, err
		}
		locked = append(locked, heldBacking{name: n, fd: bfd, key: key})
		err = ignoringEINTR(func() error { return unix.Flock(bfd, unix.LOCK_EX|unix.LOCK_NB) })
		if err == unix.EWOULDBLOCK {
			return locked, errLockHeld
		}
		if err != nil {
			return locked, err
		}
	}
	return locked, nil
}

// unlinkHeld unlinks the locked backing files from the directory fd, none
// unless each name still names the file held.
func unlinkHeld(fd int, locked []heldBacking) error {
	for _, h := range locked {
		var nst inodeStat
		if err := lstatAt(fd, h.name, &nst); err != nil {
			return err
		}
		if keyOf(&nst) != h.key {
			return unix.ENOTEMPTY // replaced meanwhile: not the file we hold
		}
	}
	for _, h := range locked {
		if err := unix.Unlinkat(fd, h.name, 0); err != nil && err != unix.ENOENT {
			return err
		}
	}
	return nil
}

// giveUpAdopted gives up the lock of the directory name in parent if it
// came to tid's lineage with parent's exclusive new-dir lock
// (lockmgr.Engine.GiveUpAdopted), so that its creator may remove or rename
// it, and reports whether it did.
func (f *FS) giveUpAdopted(parent, name string, tid int) bool {
	if f.cfg.Engine == nil || !f.cfg.Engine.GiveUpAdopted(parent, name, tid) {
		return false
	}
	f.log.WithFields(logrus.Fields{"path": joinRel(parent, name), "pid": tid}).
		Debug("removal or rename by the holder of the new-dir lock: the new directory's lock is given up")
	return true
}

// readopt locks the directory name in parent for the holder of parent's
// exclusive new-dir lock in tid's lineage, as mkdir does (AdoptNewDir):
// after a removal or rename that gave its lock up failed, or at the
// directory's new name. It logs a warning if it cannot.
func (f *FS) readopt(parent, name string, tid int) {
	ok, err := f.cfg.Engine.AdoptNewDir(context.Background(), parent, name, tid)
	if !ok {
		f.log.WithError(err).WithFields(logrus.Fields{"path": joinRel(parent, name), "pid": tid}).
			Warn("a directory whose lock its creator gave up for a removal or rename was not locked again for it")
	}
}

// openLockFile opens the backing file name in the directory dirFd for
// flock(2): never through a symlink, and only if it is a regular file (it
// is looked at through an O_PATH descriptor first, so that no device or
// FIFO is ever opened).
func openLockFile(dirFd int, name string) (int, inodeKey, error) {
	pfd, err := openBeneath(dirFd, name, unix.O_PATH, 0)
	if err != nil {
		return -1, inodeKey{}, err
	}
	defer closeFd(pfd)
	var st inodeStat
	if err := fstat(pfd, &st); err != nil {
		return -1, inodeKey{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return -1, inodeKey{}, errNotBackingFile
	}
	fd, err := resolve.Reopen(pfd, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return -1, inodeKey{}, err
	}
	return fd, keyOf(&st), nil
}

// readNames lists the directory open at fd, without "." and "..".
func readNames(fd int) ([]string, error) {
	var names []string
	err := getdents(fd, 8<<10, func(buf []byte) { _, _, names = unix.ParseDirent(buf, -1, names) })
	return names, err
}

// ignoringEINTR retries fn while it fails with EINTR.
func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}
