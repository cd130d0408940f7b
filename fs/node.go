package fs

import (
	"context"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
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

// passNode is a passthrough node: a *Dir or a *File.
type passNode interface {
	fusefs.Node
	base() *node
}

// link is one name of a node: a directory and a name in it.
type link struct {
	dir  *Dir
	name string
}

// maxLinks bounds the names remembered per node (hard links).
const maxLinks = 8

// node is what directories and other files share: one backing inode, found
// by its names, and the descriptors its open handles hold.
type node struct {
	// Dependencies
	fs *FS

	// Constant data
	key   inodeKey
	ftype uint32 // S_IFMT bits

	// links are the names the inode is known by, newest first: one for a
	// directory, possibly several for a file with hard links, none for the
	// root. A name may be stale (removed or replaced in SOURCE); every use
	// checks that it still leads to key. GUARDED_BY(fs.treeMu)
	links []link
	// lastLink is the last name of a node that has none left, for
	// messages. GUARDED_BY(fs.treeMu)
	lastLink link

	// Mutable state

	// seen is when a lookup last found the node (UnixNano).
	seen atomic.Int64
	// opened is set when the node is opened, cleared by a lookup.
	opened atomic.Bool
	// vanished is set when staleErr answers ENOENT, cleared by a lookup.
	vanished atomic.Bool

	mu sync.Mutex
	// open holds the backing descriptors of the node's open handles.
	// A handle leaves the set before its descriptor is closed.
	// GUARDED_BY(mu)
	open map[*openFile]struct{}
}

// openFile is the backing descriptor of one open handle.
type openFile struct {
	fd int
}

func (n *node) base() *node { return n }

// relPathLocked returns the path of directory d relative to SOURCE:
// "." for the root. Call with fs.treeMu held.
func (d *Dir) relPathLocked() string {
	var parts []string
	cur := d
	for cur != d.fs.root && len(parts) < 4096 {
		if len(cur.links) == 0 {
			// Not reachable from the root any more; the name cannot be
			// resolved (relPath's callers verify what they find).
			break
		}
		l := cur.links[0]
		parts = append(parts, l.name)
		cur = l.dir
	}
	if len(parts) == 0 {
		return "."
	}
	for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	return strings.Join(parts, "/")
}

// relPath returns the directory's path relative to the mount root: "." for
// the root, "a/b" otherwise, as of the last lookup or rename through the
// mount.
func (d *Dir) relPath() string {
	d.fs.treeMu.RLock()
	defer d.fs.treeMu.RUnlock()
	return d.relPathLocked()
}

// paths returns the paths of n relative to SOURCE, newest first.
func (n *node) paths() []string {
	n.fs.treeMu.RLock()
	defer n.fs.treeMu.RUnlock()
	if n == &n.fs.root.node {
		return []string{"."}
	}
	ps := make([]string, 0, len(n.links))
	for _, l := range n.links {
		ps = append(ps, joinRel(l.dir.relPathLocked(), l.name))
	}
	return ps
}

// path returns n's newest path, or the last one it had, for logs and
// for staleErr.
func (n *node) path() string {
	n.fs.treeMu.RLock()
	defer n.fs.treeMu.RUnlock()
	switch {
	case n == &n.fs.root.node:
		return "."
	case len(n.links) > 0:
		return joinRel(n.links[0].dir.relPathLocked(), n.links[0].name)
	case n.lastLink.dir != nil:
		return joinRel(n.lastLink.dir.relPathLocked(), n.lastLink.name)
	}
	return "?"
}

// addLink records that n is known as name in dir.
func (n *node) addLink(dir *Dir, name string) {
	if n == &n.fs.root.node {
		return
	}
	l := link{dir: dir, name: name}
	n.fs.treeMu.Lock()
	defer n.fs.treeMu.Unlock()
	if n.ftype == unix.S_IFDIR {
		n.links = append(n.links[:0], l)
		return
	}
	if len(n.links) > 0 && n.links[0] == l {
		return
	}
	ls := []link{l}
	for _, old := range n.links {
		if old != l && len(ls) < maxLinks {
			ls = append(ls, old)
		}
	}
	n.links = ls
}

// dropLinkLocked forgets that n is known as name in dir. A directory keeps
// its last name, so that relPath stays meaningful for a removed directory.
// Call with fs.treeMu held.
func (n *node) dropLinkLocked(dir *Dir, name string) {
	if n.ftype == unix.S_IFDIR {
		return
	}
	for i, l := range n.links {
		if l.dir == dir && l.name == name {
			n.links = append(n.links[:i:i], n.links[i+1:]...)
			if len(n.links) == 0 {
				n.lastLink = l
			}
			return
		}
	}
}

// moveLinkLocked records a rename of n from (odir, oname) to (ndir, nname).
// Call with fs.treeMu held.
func (n *node) moveLinkLocked(odir *Dir, oname string, ndir *Dir, nname string) {
	nl := link{dir: ndir, name: nname}
	if n.ftype == unix.S_IFDIR {
		n.links = append(n.links[:0], nl)
		return
	}
	ls := []link{nl}
	for _, l := range n.links {
		if (l.dir == odir && l.name == oname) || l == nl {
			continue
		}
		if len(ls) < maxLinks {
			ls = append(ls, l)
		}
	}
	n.links = ls
}

// nodeFor returns the node of the inode st describes, found as name in dir,
// creating it if the kernel does not know it yet.
func (f *FS) nodeFor(st *inodeStat, dir *Dir, name string) passNode {
	return f.nodeForNew(st, dir, name, false)
}

// nodeForNew is nodeFor; created says that the daemon has just created the
// inode, which therefore is no node the kernel knows yet, whatever an
// inode number reused without a birth time to tell says.
func (f *FS) nodeForNew(st *inodeStat, dir *Dir, name string, created bool) passNode {
	key := keyOf(st)
	ftype := st.Mode & unix.S_IFMT
	f.nodesMu.Lock()
	n, ok := f.nodes[key]
	if !ok || created || n.base().ftype != ftype {
		// New, or the inode number was reused: a fresh node, so that
		// the kernel sees a fresh inode.
		if ftype == unix.S_IFDIR {
			n = &Dir{node: node{fs: f, key: key, ftype: ftype}}
		} else {
			n = &File{node: node{fs: f, key: key, ftype: ftype}}
		}
		f.nodes[key] = n
	}
	f.nodesMu.Unlock()
	b := n.base()
	b.seen.Store(time.Now().UnixNano())
	b.opened.Store(false)
	b.vanished.Store(false)
	b.addLink(dir, name)
	return n
}

// lookupNode returns the node of a backing inode if the kernel knows it.
func (f *FS) lookupNode(key inodeKey) passNode {
	f.nodesMu.Lock()
	defer f.nodesMu.Unlock()
	return f.nodes[key]
}

// Forget drops the node from the inode map once the kernel forgets it.
func (n *node) Forget() {
	n.fs.nodesMu.Lock()
	defer n.fs.nodesMu.Unlock()
	if cur, ok := n.fs.nodes[n.key]; ok && cur.base() == n && n != &n.fs.root.node {
		delete(n.fs.nodes, n.key)
	}
}

// addOpen registers the descriptor of a new handle.
func (n *node) addOpen(of *openFile) {
	n.opened.Store(true)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.open == nil {
		n.open = make(map[*openFile]struct{})
	}
	n.open[of] = struct{}{}
}

// removeOpen unregisters a handle's descriptor; after it returns, nobody
// else uses that descriptor.
func (n *node) removeOpen(of *openFile) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.open, of)
}

// dupOpen returns a duplicate of the descriptor of one of n's open handles,
// preferring one open for writing if write is set, or -1 if there is none.
func (n *node) dupOpen(write bool) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	pick := -1
	for of := range n.open {
		if pick < 0 {
			pick = of.fd
		}
		if write {
			if fl, err := unix.FcntlInt(uintptr(of.fd), unix.F_GETFL, 0); err == nil && fl&unix.O_ACCMODE != unix.O_RDONLY {
				pick = of.fd
				break
			}
		}
	}
	if pick < 0 {
		return -1
	}
	fd, err := unix.FcntlInt(uintptr(pick), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}

// openByName opens n's inode by one of its names with flags (O_PATH for
// inode operations), checking that the name still leads to n. With no name
// left it fails with staleErr.
func (n *node) openByName(flags int) (int, error) {
	for _, p := range n.paths() {
		fd, err := openBeneath(n.fs.rootFd, p, flags, 0)
		if err != nil {
			switch err {
			case unix.ENOENT, unix.ENOTDIR, unix.ELOOP, unix.ENXIO:
				// Gone, or a symlink now sits in the path (a change
				// in SOURCE, or a race): not this name any more.
				if err == unix.ELOOP {
					n.fs.fail("resolve", p, err)
				}
				continue
			}
			return -1, err
		}
		var st inodeStat
		if err := fstat(fd, &st); err != nil {
			closeFd(fd)
			return -1, err
		}
		if keyOf(&st) == n.key {
			return fd, nil
		}
		closeFd(fd)
	}
	return -1, n.fs.staleErr(n)
}

// Windows of staleErr's retry detection.
const (
	// staleRecent: an ESTALE for the same path this recent may be the
	// one the kernel is retrying.
	staleRecent = 2 * time.Second
	// staleFresh: a node looked up this recently is being used by the
	// call that looked it up.
	staleFresh = 500 * time.Millisecond
)

// staleErr is the error for node n none of whose names leads to its inode
// any more (it was removed or replaced in SOURCE behind the kernel's cache).
// ESTALE makes the kernel look the path up again and retry the call once.
// If that retry fails too (its fresh lookup found a name that changed
// again before the call reached the daemon: a name that changes faster
// than the kernel can look it up), the program would see ESTALE; it gets
// ENOENT instead, which programs expect of a file that vanished. The retry
// is recognized as: the path got ESTALE shortly before, and the node was
// looked up just now and not yet opened since (a program that reads a file
// replaced every 100 ms keeps getting ESTALE and a successful retry).
func (f *FS) staleErr(n *node) error {
	p := n.path()
	now := time.Now()
	fresh := now.Sub(time.Unix(0, n.seen.Load())) < staleFresh && !n.opened.Load()
	f.staleMu.Lock()
	defer f.staleMu.Unlock()
	if at, ok := f.stale[p]; ok && fresh && now.Sub(at) < staleRecent && n.vanished.CompareAndSwap(false, true) {
		// Once per lookup: ENOENT does not make the kernel drop its
		// binding, so the next call on this node gets ESTALE again.
		return syscall.ENOENT
	}
	if len(f.stale) >= maxStale {
		for q, at := range f.stale {
			if now.Sub(at) >= staleRecent {
				delete(f.stale, q)
			}
		}
		if len(f.stale) >= maxStale {
			clear(f.stale)
		}
	}
	f.stale[p] = now
	return syscall.ESTALE
}

// maxStale bounds the paths staleErr remembers.
const maxStale = 1024

// withFd calls fn with a descriptor of n's inode: a duplicate of an open
// handle's descriptor if there is one (exact even for an unlinked file),
// else an O_PATH descriptor found by name.
func (n *node) withFd(write bool, fn func(fd int) error) error {
	fd := n.dupOpen(write)
	if fd < 0 {
		var err error
		fd, err = n.openByName(unix.O_PATH)
		if err != nil {
			return err
		}
	}
	defer closeFd(fd)
	return fn(fd)
}

// stat returns the backing inode's attributes.
func (n *node) stat() (inodeStat, error) {
	var st inodeStat
	err := n.withFd(false, func(fd int) error { return fstat(fd, &st) })
	return st, err
}

// Attr fills a with the backing inode's attributes.
func (n *node) Attr(ctx context.Context, a *fuse.Attr) error {
	st, err := n.stat()
	if err != nil {
		return n.fs.fail("getattr", n.path(), err)
	}
	fillAttr(&st, a)
	return nil
}

// Getattr is Attr for a getattr request.
func (n *node) Getattr(ctx context.Context, req *fuse.GetattrRequest, resp *fuse.GetattrResponse) error {
	return n.Attr(ctx, &resp.Attr)
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
	if m&unix.S_ISUID != 0 {
		mode |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

// unixPerm converts the permission bits of an os.FileMode (with setuid,
// setgid and sticky) to a unix mode.
func unixPerm(m os.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		p |= unix.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		p |= unix.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		p |= unix.S_ISVTX
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

// Setattr changes size, owner, mode and times, in that order (a chown
// clears setuid bits that a following chmod may set again). The kernel has
// checked the caller's permission (default_permissions).
func (n *node) Setattr(ctx context.Context, req *fuse.SetattrRequest, resp *fuse.SetattrResponse) error {
	v := req.Valid
	err := n.withFd(v.Size(), func(fd int) error {
		if v.Size() {
			if err := truncateFd(fd, int64(req.Size)); err != nil {
				return err
			}
		}
		if v.Uid() || v.Gid() {
			uid, gid := -1, -1
			if v.Uid() {
				uid = int(req.Uid)
			}
			if v.Gid() {
				gid = int(req.Gid)
			}
			if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
		}
		if v.Mode() {
			if n.ftype == unix.S_IFLNK {
				return syscall.EOPNOTSUPP
			}
			if err := unix.Chmod(procFdPath(fd), unixPerm(req.Mode)); err != nil {
				return err
			}
		}
		if v.Atime() || v.Mtime() || v.AtimeNow() || v.MtimeNow() {
			ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
			switch {
			case v.AtimeNow():
				ts[0] = unix.Timespec{Nsec: unix.UTIME_NOW}
			case v.Atime():
				ts[0] = unix.NsecToTimespec(req.Atime.UnixNano())
			}
			switch {
			case v.MtimeNow():
				ts[1] = unix.Timespec{Nsec: unix.UTIME_NOW}
			case v.Mtime():
				ts[1] = unix.NsecToTimespec(req.Mtime.UnixNano())
			}
			if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return n.fs.fail("setattr", n.path(), err)
	}
	return nil
}

// truncateFd sets the size of the regular file behind fd.
func truncateFd(fd int, size int64) error {
	err := unix.Ftruncate(fd, size)
	if err == unix.EBADF || err == unix.EINVAL {
		// An O_PATH or read-only descriptor: truncate the inode it names.
		err = unix.Truncate(procFdPath(fd), size)
	}
	return err
}

// Fsync flushes the inode to stable storage. fsync(2) acts on the inode,
// so any descriptor of it does.
func (n *node) Fsync(ctx context.Context, req *fuse.FsyncRequest) error {
	fd := n.dupOpen(false)
	if fd < 0 {
		flags := unix.O_RDONLY | unix.O_NONBLOCK
		if n.ftype == unix.S_IFDIR {
			flags |= unix.O_DIRECTORY
		}
		var err error
		if fd, err = n.openByName(flags); err != nil {
			return n.fs.fail("fsync", n.path(), err)
		}
	}
	defer closeFd(fd)
	var err error
	if req.Flags&1 != 0 {
		err = unix.Fdatasync(fd)
	} else {
		err = unix.Fsync(fd)
	}
	if err != nil {
		return n.fs.fail("fsync", n.path(), err)
	}
	return nil
}

// Extended attributes act on the inode through /proc/self/fd/N, which
// reaches a symlink itself, not its target.

// Getxattr returns an extended attribute.
func (n *node) Getxattr(ctx context.Context, req *fuse.GetxattrRequest, resp *fuse.GetxattrResponse) error {
	err := n.withFd(false, func(fd int) error {
		p := procFdPath(fd)
		for {
			sz, err := unix.Getxattr(p, req.Name, nil)
			if err != nil {
				return err
			}
			buf := make([]byte, sz)
			got, err := unix.Getxattr(p, req.Name, buf)
			if err == unix.ERANGE {
				continue // grew in between
			}
			if err != nil {
				return err
			}
			resp.Xattr = buf[:got]
			return nil
		}
	})
	if err != nil {
		return n.fs.fail("getxattr", n.path(), err)
	}
	return nil
}

// Listxattr lists the extended attribute names.
func (n *node) Listxattr(ctx context.Context, req *fuse.ListxattrRequest, resp *fuse.ListxattrResponse) error {
	err := n.withFd(false, func(fd int) error {
		p := procFdPath(fd)
		for {
			sz, err := unix.Listxattr(p, nil)
			if err != nil {
				return err
			}
			buf := make([]byte, sz)
			got, err := unix.Listxattr(p, buf)
			if err == unix.ERANGE {
				continue
			}
			if err != nil {
				return err
			}
			resp.Xattr = buf[:got]
			return nil
		}
	})
	if err != nil {
		return n.fs.fail("listxattr", n.path(), err)
	}
	return nil
}

// Setxattr sets an extended attribute (XATTR_CREATE and XATTR_REPLACE pass
// through).
func (n *node) Setxattr(ctx context.Context, req *fuse.SetxattrRequest) error {
	err := n.withFd(false, func(fd int) error {
		return unix.Setxattr(procFdPath(fd), req.Name, req.Xattr, int(req.Flags))
	})
	if err != nil {
		return n.fs.fail("setxattr", n.path(), err)
	}
	return nil
}

// Removexattr removes an extended attribute.
func (n *node) Removexattr(ctx context.Context, req *fuse.RemovexattrRequest) error {
	err := n.withFd(false, func(fd int) error {
		return unix.Removexattr(procFdPath(fd), req.Name)
	})
	if err != nil {
		return n.fs.fail("removexattr", n.path(), err)
	}
	return nil
}
