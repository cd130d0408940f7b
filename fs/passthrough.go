package fs

import (
	"fmt"
	"sync"
	"syscall"

	"bazil.org/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// FUSE passthrough (docs/DATA-PATH.md). Where the kernel offers it and the
// daemon may use it (CAP_SYS_ADMIN), the reply to every open and create of
// a regular file names a backing file, registered once per inode with
// FUSE_DEV_IOC_BACKING_OPEN: the kernel then reads, writes, splices and
// maps that file itself, and the daemon sees none of those requests. Locks,
// fsync, fallocate, truncate and every metadata request still reach the
// daemon.
//
// The kernel's rules, which decide the shape of this file:
//   - an inode open for passthrough may only be opened for passthrough,
//     with the same backing file, and an inode with a cached (ordinary)
//     open may not be opened for passthrough: the open fails with EIO.
//     So each inode has one backing id, shared and counted by all its
//     passthrough opens, and an inode that has an ordinary open (a
//     registration failed) gets only ordinary opens until they all end;
//   - FOPEN_KEEP_CACHE (and any flag but DIRECT_IO, PARALLEL_DIRECT_WRITES
//     and NOFLUSH) with FOPEN_PASSTHROUGH fails the open;
//   - the backing id only names the file: each open gets its own backing
//     open file description, with the caller's flags (O_APPEND, O_DIRECT).
//     So the daemon registers a descriptor of its own, opened read-only
//     for the purpose and closed right after the ioctl; the kernel keeps
//     its reference. It is never a handle's descriptor, whose flock(2)
//     lock must end when the handle is released.
//
// A passthrough handle closes its own backing descriptor once the open is
// answered, where the inode can be found again by file handle (detach.go),
// and opens one for a flock(2) lock or a request that needs it; else it
// keeps it as without passthrough. The daemon holds no descriptor for the
// registration (on this kernel, 6.18: later kernels install one in the
// daemon's table per backing id, to show it to lsof).

// passthroughOKFlags are the open reply flags the kernel accepts with
// FOPEN_PASSTHROUGH: FOPEN_DIRECT_IO, FOPEN_PARALLEL_DIRECT_WRITES (1<<6)
// and FOPEN_NOFLUSH (1<<5). Any other fails the open.
const passthroughOKFlags = fuse.OpenPassthrough | fuse.OpenDirectIO | 1<<5 | 1<<6

// ioMode is how a handle's open went to the kernel.
type ioMode uint8

const (
	ioUntracked   ioMode = iota // passthrough off for the mount
	ioPassthrough               // with the inode's backing id
	ioCached                    // ordinary, while passthrough is on
)

// passthrough is the mount's passthrough state and the backing ids of the
// inodes open for it.
type passthrough struct {
	// mu guards everything below. It is held across the BACKING_OPEN and
	// BACKING_CLOSE ioctls (neither blocks) so that an id is never closed
	// while an open is about to name it.
	mu sync.Mutex
	// conn is the connection the ioctls go to; nil before Serve.
	conn *fuse.Conn // GUARDED_BY(mu)
	// backingOpen is conn.BackingOpen (a test makes it fail).
	backingOpen func(fd int) (int32, error) // GUARDED_BY(mu)
	// on: opens try passthrough. why says why not, when not.
	on  bool   // GUARDED_BY(mu)
	why string // GUARDED_BY(mu)
	// inodes maps each kernel inode (node) with an open of the mode
	// that excludes the other to its state. GUARDED_BY(mu)
	inodes map[*File]*inodeIO
	// warned holds the errnos of BACKING_OPEN already logged.
	warned map[syscall.Errno]bool // GUARDED_BY(mu)
}

// inodeIO counts the open handles of one inode by mode.
type inodeIO struct {
	id     int32 // backing id; 0 when passthrough == 0
	pt     int   // handles open for passthrough
	cached int   // handles open without, while passthrough is on
}

// PassthroughOption asks the kernel for FUSE passthrough on a mount of
// source. The kernel needs the depth of file system stacking allowed
// below the mount: 1 over a disk file system, 2 when source is itself on
// overlayfs or FUSE (whose own depth is 1).
func PassthroughOption(source string) fuse.MountOption {
	depth := uint32(1)
	var s unix.Statfs_t
	if unix.Statfs(source, &s) == nil {
		switch s.Type {
		case unix.OVERLAYFS_SUPER_MAGIC, unix.FUSE_SUPER_MAGIC, unix.ECRYPTFS_SUPER_MAGIC:
			depth = 2
		}
	}
	return fuse.Passthrough(depth)
}

// attachConn decides, once the kernel has answered INIT, whether opens use
// passthrough, and logs the decision once.
func (f *FS) attachConn(conn *fuse.Conn) {
	p := &f.pt
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		return
	}
	p.conn = conn
	// Without CAP_FSETID: passthrough writes then clear set-id bits
	// (setid.go).
	p.backingOpen = backingOpenNoFSETID(conn.BackingOpen)
	p.inodes = make(map[*File]*inodeIO)
	p.warned = make(map[syscall.Errno]bool)
	switch {
	case !f.cfg.Passthrough:
		p.why = "turned off (--passthrough=off)"
	case conn.Features()&fuse.InitPassthrough == 0:
		p.why = fmt.Sprintf("the kernel did not agree to FUSE passthrough (protocol %v; needs Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH, no writeback cache)", conn.Protocol())
	case !hasCapSysAdmin():
		p.why = "the daemon lacks CAP_SYS_ADMIN, which FUSE_DEV_IOC_BACKING_OPEN needs"
	default:
		p.on = true
	}
	e := f.log.WithField("protocol", conn.Protocol().String())
	if p.on {
		if f.byHandle != nil {
			e = e.WithField("open_files", "cost the daemon no descriptor")
		} else {
			e = e.WithField("open_files", "cost the daemon a descriptor each: "+f.noHandles)
		}
		e.Info("FUSE passthrough on: regular files are read, written and mapped by the kernel directly")
	} else {
		e.WithField("why", p.why).Info("FUSE passthrough off: reads and writes go through the daemon")
	}
}

// PassthroughState reports whether opens of regular files use FUSE
// passthrough and, if not, why ("" before the mount is served).
func (f *FS) PassthroughState() (on bool, why string) {
	f.pt.mu.Lock()
	defer f.pt.mu.Unlock()
	return f.pt.on, f.pt.why
}

// openPassthrough makes the open of h a passthrough open if it can be,
// setting resp's flags and backing id, and records h's mode (released by
// releasePassthrough). fd is h's backing descriptor.
func (f *FS) openPassthrough(h *fileHandle, st *inodeStat, resp *fuse.OpenResponse) {
	p := &f.pt
	p.mu.Lock()
	defer p.mu.Unlock()
	n := h.n
	io := p.inodes[n]
	if !p.on && (io == nil || io.pt == 0) {
		// Off, or turned off since (EPERM): an inode already open for
		// passthrough keeps its id, any other is opened as usual.
		return
	}
	if io == nil {
		io = &inodeIO{}
		p.inodes[n] = io
	}
	if io.pt == 0 && h.of.write && hasSetID(st) {
		// Its writes reach the daemon, which clears the set-id bits
		// for a writer without CAP_FSETID, as Linux does (setid.go).
		io.cached++
		h.io = ioCached
		return
	}
	if io.pt == 0 && io.cached == 0 {
		io.id = p.register(h)
	}
	if io.id == 0 || io.cached > 0 {
		// An ordinary open; so are the inode's next, until all end.
		io.cached++
		h.io = ioCached
		return
	}
	io.pt++
	h.io = ioPassthrough
	resp.Flags = resp.Flags&passthroughOKFlags | fuse.OpenPassthrough
	resp.BackingID = io.id
}

// register registers a descriptor of h's inode (backingFd's) as a backing
// file and returns its id; 0 if it cannot be (logged once per errno; EPERM
// turns passthrough off for the mount). GUARDED_BY(p.mu)
func (p *passthrough) register(h *fileHandle) int32 {
	n := h.n
	rfd, err := h.backingFd()
	if err != nil {
		p.warn(n, "reopen", err)
		return 0
	}
	id, err := p.backingOpen(rfd)
	closeFd(rfd)
	if err != nil {
		p.warn(n, "FUSE_DEV_IOC_BACKING_OPEN", err)
		if errnoOf(err) == syscall.EPERM {
			p.on = false
			p.why = "FUSE_DEV_IOC_BACKING_OPEN: EPERM"
		}
		return 0
	}
	return id
}

// warn logs, once per errno, that a file is served without passthrough.
// GUARDED_BY(p.mu)
func (p *passthrough) warn(n *File, what string, err error) {
	errno := errnoOf(err)
	if p.warned[errno] {
		return
	}
	p.warned[errno] = true
	n.fs.log.WithFields(logrus.Fields{"path": n.path(), "errno": unix.ErrnoName(errno)}).WithError(err).
		Warn(what + " failed: this file, and others failing so, are served without passthrough (logged once per errno)")
}

// releasePassthrough ends h's part in its inode's mode; the last
// passthrough handle closes the backing id.
func (f *FS) releasePassthrough(h *fileHandle) {
	if h.io == ioUntracked {
		return
	}
	p := &f.pt
	p.mu.Lock()
	defer p.mu.Unlock()
	io := p.inodes[h.n]
	if io == nil {
		return
	}
	switch h.io {
	case ioPassthrough:
		io.pt--
		if io.pt == 0 {
			if err := p.conn.BackingClose(io.id); err != nil {
				f.log.WithFields(logrus.Fields{"path": h.n.path(), "errno": unix.ErrnoName(errnoOf(err))}).
					Warn("FUSE_DEV_IOC_BACKING_CLOSE failed")
			}
			io.id = 0
		}
	case ioCached:
		io.cached--
	}
	if io.pt == 0 && io.cached == 0 {
		delete(p.inodes, h.n)
	}
}

// hasCapSysAdmin reports whether CAP_SYS_ADMIN is in the daemon's
// effective capabilities.
func hasCapSysAdmin() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	const bit = unix.CAP_SYS_ADMIN
	return data[bit/32].Effective&(1<<(bit%32)) != 0
}
