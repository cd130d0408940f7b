package fs

import (
	"bazil.org/fuse"
)

// MountOptions returns the options every lockfs mount uses. The kernel
// checks permissions itself (default_permissions) and hands every flock and
// fcntl lock to the daemon. There is no writeback cache: writes go to
// SOURCE when the write(2) returns, so that programs writing SOURCE
// directly see them. The daemon clears set-id bits (setid.go), so that the
// kernel need not ask for security.capability before every write.
func MountOptions(fsname string, allowOther bool) []fuse.MountOption {
	return mountOptions(fsname, allowOther, true)
}

// mountOptions is MountOptions; without killPriv (a test's control) the
// kernel clears set-id bits itself.
func mountOptions(fsname string, allowOther, killPriv bool) []fuse.MountOption {
	opts := []fuse.MountOption{
		fuse.FSName(fsname),
		fuse.Subtype("lockfs"),
		fuse.DefaultPermissions(),
		fuse.LockingFlock(),
		fuse.LockingPOSIX(),
		fuse.MaxReadahead(128 << 10),
		fuse.AsyncRead(),
	}
	if killPriv {
		opts = append(opts, fuse.HandleKillPriv())
	}
	if allowOther {
		opts = append(opts, fuse.AllowOther())
	}
	return opts
}

// SpliceReadsOption caps the kernel's read requests at what a pipe can
// carry with the reply header (fuse.SpliceReadMax: 1020 KiB with the
// default pipe-max-size), for an FS with Config.SpliceReads. Without the
// cap, the kernel's 1 MiB readahead requests would not fit, and would be
// answered by pread.
//
// Where pipes are smaller than spliceCapMin (pipe-max-size lowered by the
// administrator), the cap would multiply the requests of every sequential
// read; it is then left out, and the reads that do not fit a pipe are
// answered by pread.
func SpliceReadsOption() fuse.MountOption {
	return fuse.MaxRead(uint32(spliceReadCap(fuse.SpliceReadMax())))
}

// spliceCapMin is the smallest read cap SpliceReadsOption sets.
const spliceCapMin = 512 << 10

// spliceReadCap is the max_read for pipes that carry reads of up to max
// bytes: max, or 0 (no cap) below spliceCapMin.
func spliceReadCap(max int) int {
	if max < spliceCapMin {
		return 0
	}
	return max
}

// ReadDirPlusOption asks the kernel for READDIRPLUS on every directory
// read (not the adaptive FUSE_READDIRPLUS_AUTO, which reads plainly past
// the first batch of a listing unless a lookup came in between: a tree
// walk that lists a directory whole before it stats its entries, as du
// and tar do, would then look most names up one by one). For mounts of
// an FS with Config.ReadDirPlus.
func ReadDirPlusOption() fuse.MountOption {
	return fuse.ReadDirPlus(false)
}
