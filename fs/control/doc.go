// Package control serves lockfs's control files: .lock, .lock_newdir and
// .lock_usage in every directory of a mount. A flock(2) or fcntl(2) lock on
// one is the lock engine's hierarchical directory lock of that directory
// (kind dir, newdir or usage; lockmgr), not a lock of any file: the
// byte-range and flock locks of ordinary files are package fs's, applied
// to the backing file.
//
// The files:
//
//   - files.go: the control files of one mount (Files), what they need
//     of it (Config) and of each directory (Dir), their inode numbers;
//   - control.go: the nodes and handles, their attributes, the note a
//     descriptor writes;
//   - lock.go: lock requests and F_GETLK, read top down: the lock a
//     control file takes, the owners (flock: the open file description;
//     POSIX and OFD: the kernel's lock owner), the permission on the
//     directory, and a request that follows its renamed directory;
//   - release.go: unlock, and the releases at Flush and Release;
//   - lockcheck.go: the one map from a lock error to its errno, and the
//     log line of a refusal;
//   - refusals.go: how often a refusal is logged, and who was in the way;
//   - status.go: the status text a read returns (SPEC §6);
//   - owners.go: the per-node record of which owner locked through which
//     handle (made by remember, lock.go; taken out by forget, release.go).
//
// A control file reaches its directory only through the Dir interface,
// which package fs's Dir implements; control imports nothing of fs.
//
// # Locking
//
// LOCK ORDERING: Files.mu, then controlNode.mu, then controlHandle.mu. None
// is held across an engine call or a call into the directory (Dir).
//
// # Errors
//
// lockErrno maps every error of a lock call to its errno (SPEC §3), and
// refuse logs each refused or failed request once, at most one line per
// lock per refusalWindow.
package control
