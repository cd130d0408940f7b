package fs

import (
	"os"
	"time"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"
)

// inodeKey names a backing inode.
type inodeKey struct {
	dev, ino uint64
	// btime is the inode's birth time in nanoseconds, where the file
	// system reports one (0 otherwise): it tells a file whose inode
	// number was freed and given to a new file from that new file.
	btime int64
}

func keyOf(st *inodeStat) inodeKey {
	return inodeKey{dev: st.Dev, ino: st.Ino, btime: st.btime}
}

// inodeStat is a stat(2) result and the birth time, from statx(2).
type inodeStat struct {
	unix.Stat_t
	btime int64 // ns; 0 if unknown
}

// statx fills st for name relative to dirFd (flags as for statx(2)).
func statx(dirFd int, name string, flags int, st *inodeStat) error {
	var x unix.Statx_t
	for {
		err := unix.Statx(dirFd, name, flags|unix.AT_STATX_SYNC_AS_STAT, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &x)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	ts := func(t unix.StatxTimestamp) unix.Timespec { return unix.Timespec{Sec: t.Sec, Nsec: int64(t.Nsec)} }
	*st = inodeStat{Stat_t: unix.Stat_t{
		Dev:     unix.Mkdev(x.Dev_major, x.Dev_minor),
		Ino:     x.Ino,
		Nlink:   uint64(x.Nlink),
		Mode:    uint32(x.Mode),
		Uid:     x.Uid,
		Gid:     x.Gid,
		Rdev:    unix.Mkdev(x.Rdev_major, x.Rdev_minor),
		Size:    int64(x.Size),
		Blksize: int64(x.Blksize),
		Blocks:  int64(x.Blocks),
		Atim:    ts(x.Atime),
		Mtim:    ts(x.Mtime),
		Ctim:    ts(x.Ctime),
	}}
	if x.Mask&unix.STATX_BTIME != 0 {
		st.btime = x.Btime.Sec*1e9 + int64(x.Btime.Nsec)
	}
	return nil
}

// fstat fills st for the inode behind fd (an O_PATH descriptor included).
func fstat(fd int, st *inodeStat) error {
	return statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, st)
}

// lstatAt fills st for name in directory dirFd, not following a symlink.
func lstatAt(dirFd int, name string, st *inodeStat) error {
	return statx(dirFd, name, unix.AT_SYMLINK_NOFOLLOW, st)
}

// fillAttr converts a backing stat to FUSE attributes.
func fillAttr(st *inodeStat, a *fuse.Attr) {
	a.Inode = st.Ino
	a.Size = uint64(st.Size)
	a.Blocks = uint64(st.Blocks)
	a.Atime = time.Unix(st.Atim.Unix())
	a.Mtime = time.Unix(st.Mtim.Unix())
	a.Ctime = time.Unix(st.Ctim.Unix())
	a.Mode = goMode(st.Mode)
	a.Nlink = uint32(st.Nlink)
	a.Uid = st.Uid
	a.Gid = st.Gid
	a.Rdev = uint32(st.Rdev)
	a.BlockSize = uint32(st.Blksize)
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		a.Valid = dirAttrValid
	} else {
		a.Valid = fileAttrValid
	}
}

// goMode converts a unix mode to an os.FileMode.
func goMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= os.ModeDir
	case unix.S_IFCHR:
		mode |= os.ModeDevice | os.ModeCharDevice
	case unix.S_IFBLK:
		mode |= os.ModeDevice
	case unix.S_IFIFO:
		mode |= os.ModeNamedPipe
	case unix.S_IFLNK:
		mode |= os.ModeSymlink
	case unix.S_IFSOCK:
		mode |= os.ModeSocket
	}
	for _, b := range specialBits {
		if m&b.unix != 0 {
			mode |= b.mode
		}
	}
	return mode
}

// specialBits pairs the setuid, setgid and sticky bits of a unix mode with
// their os.FileMode flags, for goMode and unixPerm. Never written.
var specialBits = [...]struct {
	unix uint32
	mode os.FileMode
}{
	{unix.S_ISUID, os.ModeSetuid},
	{unix.S_ISGID, os.ModeSetgid},
	{unix.S_ISVTX, os.ModeSticky},
}

// unixPerm converts the permission bits of an os.FileMode (with setuid,
// setgid and sticky) to a unix mode.
func unixPerm(m os.FileMode) uint32 {
	p := uint32(m.Perm())
	for _, b := range specialBits {
		if m&b.mode != 0 {
			p |= b.unix
		}
	}
	return p
}

// unixType converts the type bits of an os.FileMode to S_IFMT bits.
func unixType(m os.FileMode) uint32 {
	switch {
	case m&os.ModeDir != 0:
		return unix.S_IFDIR
	case m&os.ModeCharDevice != 0:
		return unix.S_IFCHR
	case m&os.ModeDevice != 0:
		return unix.S_IFBLK
	case m&os.ModeNamedPipe != 0:
		return unix.S_IFIFO
	case m&os.ModeSymlink != 0:
		return unix.S_IFLNK
	case m&os.ModeSocket != 0:
		return unix.S_IFSOCK
	}
	return unix.S_IFREG
}
