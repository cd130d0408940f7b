package fs

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Set-id bits (docs/DATA-PATH.md "Set-id bits").
//
// Linux clears a regular file's set-user-ID bit, and its set-group-ID bit
// if the group may execute it, when a process without CAP_FSETID writes,
// truncates or allocates in it, and on every chown. The mount takes
// FUSE_HANDLE_KILLPRIV_V2 (MountOptions), which moves that duty from the
// kernel to the daemon. Without it the kernel does it itself, but asks
// the daemon for security.capability before every write(2): FUSE never
// marks an inode as having no privileges to drop (S_NOSEC) otherwise, so
// each write cost a round trip, 5 % of a 1 MiB write and most of a small
// one. With it the kernel asks once, and again only after it refreshes
// the file's attributes. The daemon's part:
//
//   - a WRITE, a SETATTR of size or owner, or a CREATE with O_TRUNC that
//     the kernel flags (the caller lacks CAP_FSETID) clears the bits
//     (killSetID) before it changes the file. An open(O_TRUNC) arrives as
//     a SETATTR of size: the mount does not take atomic O_TRUNC, so the
//     kernel strips O_TRUNC from OPEN and never flags one;
//   - FALLOCATE carries no flag: the bits are cleared when the caller is
//     not root;
//   - passthrough writes never reach the daemon. So a file that has the
//     bits when it is opened for writing gets an ordinary open, not a
//     passthrough one, unless the inode is open for passthrough already
//     (openPassthrough): its writes come to the daemon, flagged as above.
//   - in that last case, and for a file given the bits while open for
//     passthrough writing, SOURCE's file system clears them: the kernel
//     writes the backing file with the credentials of the thread that
//     registered it (FUSE_DEV_IOC_BACKING_OPEN), and the daemon registers
//     it without CAP_FSETID in that thread's effective set
//     (backingOpenNoFSETID), as for an unprivileged writer. For root's
//     writes too, and the mount shows the old mode until the kernel
//     refreshes the file's attributes (fileAttrValid): the one difference
//     from a local file system.
//
// security.capability needs nothing: the kernel removes it through the
// mount (REMOVEXATTR) at the first write that finds it, and SOURCE's file
// system at every write, the daemon's or the kernel's.

// setIDBits returns the bits of a regular file's mode that a write by a
// process without CAP_FSETID clears: set-user-ID, and set-group-ID if the
// group may execute the file.
func setIDBits(mode uint32) uint32 {
	kill := uint32(unix.S_ISUID)
	if mode&unix.S_IXGRP != 0 {
		kill |= unix.S_ISGID
	}
	return mode & kill
}

// hasSetID reports whether a write by a process without CAP_FSETID would
// clear bits of a regular file with attributes st.
func hasSetID(st *inodeStat) bool { return setIDBits(st.Mode) != 0 }

// killSetID clears the set-user-ID bit of the regular file behind fd, and
// its set-group-ID bit if the group may execute it. It reports whether the
// mode changed.
func killSetID(fd int) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, nil
	}
	kill := setIDBits(st.Mode)
	if kill == 0 {
		return false, nil
	}
	return true, unix.Chmod(procFdPath(fd), st.Mode&0o7777&^kill)
}

// capFSETID is CAP_FSETID's word and bit in the capability sets.
const capFSETIDWord, capFSETIDBit = unix.CAP_FSETID / 32, uint32(1) << (unix.CAP_FSETID % 32)

// backingOpenNoFSETID wraps a FUSE_DEV_IOC_BACKING_OPEN call so that it
// runs on a thread without CAP_FSETID in its effective set (capabilities
// are a thread's; the bit stays permitted and comes back right after). If
// it cannot be put back, which the kernel allows whenever the bit is
// permitted, the goroutine stays on that thread: the thread is never
// handed to other goroutines, and the daemon's own writes from it clear
// set-id bits, the safe side.
//
// The sets are read once, here: every thread of the daemon has the same
// (nothing else in it changes them, and a call puts back what it
// dropped), so a call makes two capset(2)s and no capget(2).
func backingOpenNoFSETID(open func(fd int) (int32, error)) func(fd int) (int32, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var had [2]unix.CapUserData
	if err := unix.Capget(&hdr, &had[0]); err != nil {
		return func(int) (int32, error) { return 0, err }
	}
	if had[capFSETIDWord].Effective&capFSETIDBit == 0 {
		return open
	}
	without := had
	without[capFSETIDWord].Effective &^= capFSETIDBit
	return func(fd int) (int32, error) {
		runtime.LockOSThread()
		h := hdr
		if err := unix.Capset(&h, &without[0]); err != nil {
			runtime.UnlockOSThread()
			return 0, err
		}
		id, err := open(fd)
		h = hdr
		if unix.Capset(&h, &had[0]) == nil {
			runtime.UnlockOSThread()
		}
		return id, err
	}
}
