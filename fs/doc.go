// Package fs is lockfs's FUSE layer: a passthrough of SOURCE plus the
// control files (.lock, .lock_newdir, .lock_usage) in every directory. The
// control files, whose flock(2) and fcntl(2) requests are the lock
// engine's hierarchical directory locks, are package fs/control's: fs finds
// them by name (controlfiles.go) and serves them each directory as a
// control.Dir. The flock(2) and byte-range locks of ordinary files are
// package fs/filelock's, applied to the backing file (handlelock.go). fs
// cancels the interrupted waits of both (interrupt.go).
//
// # The model
//
// An FS serves one mount with bazil.org/fuse. Its nodes are of three kinds:
//
//   - Dir, a directory of SOURCE;
//   - File, anything else of SOURCE: regular files, symlinks, FIFOs,
//     sockets, devices (the kernel opens only regular files through the
//     daemon);
//   - the control files, which exist only in the daemon.
//
// One backing inode (st_dev, st_ino, and the birth time where the file
// system reports one, which tells a reused inode number from the file that
// had it) is one Node, so that the kernel sees hard links as one inode and
// the locks of all names of a file agree; the attributes pass the backing
// inode number through. A node does not hold
// its inode open: it remembers the names it was found by (a parent Dir and
// a name; several for hard links, one for a directory), updated by lookups,
// renames, links and removals through the mount, and every operation finds
// the inode again by one of those names and checks that it is still the
// same inode. Dir.relPath gives a directory's path relative to the mount
// root ("." for the root), which the control files use as the lock's name.
//
// An open file or directory (a handle) owns its own backing open file
// description, so reads and writes go straight to SOURCE (there is no
// writeback cache) and a file unlinked while open keeps working through its
// handles; metadata operations on a node with open handles use their
// descriptor, which is exact. A handle of a regular file opened for FUSE
// passthrough gives its descriptor up once the open is answered (the
// kernel keeps the backing file) and finds the inode again by file handle
// when a request needs it (detach.go).
//
// The daemon checks no permission itself: the mount uses
// default_permissions, so the kernel checks every request against the
// attributes first. As root, the daemon gives each file it creates to the
// uid and gid of the process that asked (the directory's group in a setgid
// directory, which also passes its setgid bit to new directories), with
// the mode that process asked for, unaffected by the daemon's umask.
// The sticky bit shows through the mount (the fork encodes it, PATCHES.md
// 1), and lockfs enforces it itself too: in a sticky directory only the
// owner of an entry, the owner of the directory or root may remove or
// rename it.
//
// Reserved names: the control names exist in every directory and shadow
// any file of that name in SOURCE. They are found by name only: readdir
// lists them only with Config.ListControlFiles (SPEC §1), so that tools
// that walk trees never meet them. The files the lock backend keeps in
// SOURCE (lockmgr.Engine.SourceNames: the local backend's ..LOCK,
// ..LOCK_NEWDIR, ..LOCK_USAGE) are never listed and never found. Removing,
// renaming or linking a control file, and renaming onto or linking to a
// backing name, fail with EPERM; mkdir, mknod, symlink and O_EXCL create
// of any reserved name fail with EEXIST (so does link(2) onto a control
// name: the kernel sees that the name exists and does not ask). Opening a
// control file with O_CREAT opens it.
//
// A directory that was ever locked keeps its backing files in SOURCE, so it
// looks empty through the mount while its backing directory is not. rmdir
// of it, and rename(2) of a directory over it, remove the backing files
// first and then the directory, if they are all it holds and nobody holds a
// flock on any of them: each is opened beneath the directory without
// following a symlink (anything but a regular file is refused, ENOTEMPTY),
// flocked LOCK_EX|LOCK_NB, and unlinked while that flock is held. A lock
// held on the directory, by anyone (this daemon, another daemon, a program
// locking SOURCE directly), makes it fail with EBUSY and removes nothing;
// any other entry gives ENOTEMPTY as before and removes nothing. The
// fencing-token counters go with the files: a directory made again under
// the same name starts its tokens from 1 (rmdir.go).
//
// A directory with a lock held on it or below it is not renamed (EBUSY):
// the lock is that of the directory's current path, and the engine's
// GuardTree (the local backend: an exclusive flock without waiting on the
// directory's ..LOCK, which every claim at or below it holds shared) finds
// every holder and holds new grants off while the rename runs.
//
// renameat2(2)'s RENAME_NOREPLACE and RENAME_EXCHANGE work as on SOURCE
// (the fork decodes FUSE_RENAME2); RENAME_WHITEOUT is EINVAL.
//
// Not supported: O_TMPFILE (EOPNOTSUPP).
//
// # Safety
//
// Every backing operation stays beneath SOURCE, whatever SOURCE's other
// users do meanwhile. The daemon holds an O_PATH descriptor of SOURCE and
// resolves every path relative to it with openat2(2) and RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS, always with O_NOFOLLOW:
// resolution can neither leave SOURCE (through "..", an absolute symlink
// or a mount point's parent) nor follow any symlink. A path longer than one
// call takes (a tree deeper than PATH_MAX) is resolved piece by piece, each
// piece beneath the directory the last one opened (internal/resolve). Following none is
// exact, not a restriction: the kernel resolves the symlinks of the mount
// itself, component by component, so a backing path of a node never
// contains one unless SOURCE changed under the mount (or someone races to
// swap a directory for a symlink), and then the operation finds ELOOP and
// answers as for a stale name. Operations on a name act on the parent's
// descriptor (mkdirat, mknodat, symlinkat, linkat, unlinkat, renameat,
// fstatat and openat with O_NOFOLLOW); operations on an inode act on a
// descriptor of it (fstat, fchownat and utimensat with AT_EMPTY_PATH), or on
// /proc/self/fd/N for the calls that have no descriptor form (chmod,
// truncate, the xattr calls): that path names exactly the inode behind the
// daemon's own descriptor N, a symlink itself included. Every backing open
// of a regular file carries O_NONBLOCK until it is checked, so that a FIFO
// swapped in cannot block the daemon; only an exclusive create (O_CREAT |
// O_EXCL), which can open nothing but the file it creates, goes without.
// TestPTSymlinkSwapRaceStaysBeneath
// swaps a directory of SOURCE with a symlink leading out of it, as fast as
// it can, while processes write, create, truncate, chmod, chown, rename,
// link and remove through it; nothing outside SOURCE changes (its control
// shows that a program joining paths under SOURCE does escape).
//
// # Caching
//
// The kernel may keep a name's binding to a node for 1 s (entryValid), a
// directory's attributes for 1 s (dirAttrValid) and any other file's
// attributes for 1 s (fileAttrValid). Measured on the development VM
// (BenchmarkPTStat): stat(2) of a file costs about 70 µs through the mount
// uncached against 3 µs with a 1 s cache and 1.5 µs on SOURCE itself; with
// no file attribute cache a create+stat+unlink cycle took ten FUSE
// requests, with it eight (the two left are GETATTRs of the directory,
// whose attributes the kernel drops after each create and unlink and needs
// for its permission check).
//
// How changes made directly in SOURCE (or through another mount of it) are
// seen through the mount:
//
//   - a new name: at once (failed lookups are not cached);
//   - a file's size, times, mode, owner: within 1 s, and at once after an
//     open(2) of the file or a lock granted on it, which invalidate the
//     kernel's attributes if the file changed, or a directory lock granted
//     on its directory, which drops its name and attributes (invalidate.go);
//   - a file's data: at each open(2) and each lock granted on the file,
//     which drop the kernel's cached pages if the file changed in SOURCE
//     (close-to-open and lock consistency, as NFS; cache.go and
//     docs/DATA-PATH.md). A descriptor that stays open without locking may
//     read stale pages; shared-memory files (-shm) are revalidated at every
//     lock and unlock (shm.go);
//   - a name removed or replaced (rename over it, or rmdir and mkdir):
//     at once for the next operation that reaches the daemon: the stale
//     node answers ESTALE, the kernel looks the path up again and retries.
//     If the retry is stale too (the name changed again between the
//     retry's lookup and its call: it changes faster than the kernel can
//     look it up), the answer is ENOENT;
//   - a directory's own attributes and listing: its attributes within 1 s,
//     its listing at every opendir(3)/rewinddir(3).
//
// A node with an open handle answers stat(2) from the handle's descriptor
// (fstat of an unlinked open file must work, and FUSE does not say whether
// a getattr comes from stat or fstat). The kernel sends Release after
// close(2) has returned, so a file removed directly in SOURCE right after
// its last close through the mount can be found by stat(2) for that moment.
//
// # Locks on ordinary files
//
// The mount asks the kernel for every flock(2) and fcntl(2) lock (the
// control files need that), so those of regular files arrive here too;
// package fs/filelock serves them (handlelock.go hands them over) and
// applies them to the backing file in the host kernel: locks
// through the mount and locks taken on SOURCE directly exclude each other
// as on one local file system, and SQLite, flock(1) on a data file, and
// Java or Python file locks work through the mount. flock locks are
// flock(2) on the handle's own backing descriptor. POSIX record locks and
// OFD locks become OFD locks on a backing open file description kept per
// (inode, lock owner), which gives each owner POSIX semantics; it is closed
// when the owner closes any descriptor of the file (POSIX) or when a handle
// it locked through is released (OFD). A blocking request (F_SETLKW,
// flock without LOCK_NB) polls non-blocking attempts with jittered
// backoff from 1 ms to 50 ms, so that no daemon thread ever sleeps where an
// interrupt cannot reach it: an interrupted or killed waiter stops at once
// (EINTR), and a waiter gets the lock at most about 50 ms after it is
// free. A byte-range wait that would close a cycle of waits among the
// mount's lock owners fails with EDEADLK, as the kernel's does; flock(2)
// waits have no deadlock detection. F_GETLK reports the
// conflicting lock and its holder's pid (for locks taken through the mount,
// the pid that last locked through that owner).
//
// # Errors
//
// Backing errors are returned as their errno. Every failed request is
// logged once, with its op and path: routine errnos (ENOENT, EEXIST,
// EAGAIN, EACCES, ...) at debug level, refusals by lockfs's own rules
// (reserved names, sticky directories, rmdir of a locked directory) and a
// symlink met in a backing path at info, anything else at warning. A node none of whose names leads to
// its inode any more answers ESTALE (then ENOENT, as above). Names the
// kernel never sends ("", ".", "..", a slash) are refused with EINVAL.
package fs
