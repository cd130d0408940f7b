// Package filelock serves the locks of ordinary files of a lockfs mount:
// flock(2), POSIX record locks and OFD locks taken through the mount on a
// regular file. They are applied to the backing file in the host kernel,
// so that they and the locks taken on SOURCE directly exclude each other
// as on one local file system. They are not the hierarchical directory
// locks of the control files (.lock, package fs/control and the engine,
// lockmgr).
//
// The files:
//
//   - file.go: what a request needs of its file (File, Inode) and the
//     lock state a file keeps (Handle);
//   - filelock.go: the model (see its first comment), the Table of one
//     mount, the carriers of byte-range lock owners, lock, wait, unlock;
//   - deadlock.go: the wait-for graph of byte-range waits, and EDEADLK
//     for a wait that would close a cycle (SPEC §1);
//   - query.go: F_GETLK, and finding the owner of an OFD lock through
//     /proc/self/fdinfo.
//
// A lock request reaches its file through the File interface, which
// package fs's file handles implement; filelock imports nothing of fs.
//
// # Locking
//
// LOCK ORDERING: Handle.mu → Table.ownersMu; Table.waits.mu is taken
// before ownersMu and fileLockOwner.mu. None is held while a File is
// called, but for File.Inode, which reads a constant.
//
// # Errors
//
// A conflict is EAGAIN; an interrupted wait EINTR; a cycle of byte-range
// waits EDEADLK; a new carrier beyond the user's descriptor cap ENOLCK.
// Any other failure of a backing call is passed to Config.Fail, which logs
// it and gives its errno.
package filelock
