package fs

import (
	"golang.org/x/sys/unix"
)

// openFile is the backing descriptor of one open handle, or a directory's
// pin (pin.go), which is released when it is dropped.
type openFile struct {
	// Constant data
	fd int
	// write says that fd is open for writing.
	write bool
	// uid is the user the handle is counted for (handleCap).
	uid uint32

	// Mutable state, GUARDED_BY(mu) of the node whose handle it is.

	// borrowers counts the operations using fd through borrowOpen.
	borrowers int
	// released is set when the handle is released. INVARIANT: fd is
	// open while !released or borrowers > 0.
	released bool
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

// releaseOpen unregisters a released handle's descriptor and closes it, or
// leaves that to its last borrower. A detached handle's (fd -1) was never
// registered.
func (n *node) releaseOpen(of *openFile) {
	if of.fd < 0 {
		return
	}
	n.fs.handles.give(of.uid)
	n.mu.Lock()
	delete(n.open, of)
	of.released = true
	last := of.borrowers == 0
	n.mu.Unlock()
	if last {
		closeFd(of.fd)
	}
}

// borrowOpen returns the descriptor of one of n's open handles, preferring
// one open for writing if write is set, or nil if there is none. It stays
// open, even if its handle is released meanwhile, until returnOpen: as a
// duplicate would, without the dup(2) and close(2). Borrowers must not
// change the descriptor's state (offset, flags), which its handle owns.
// If n's open handles are all detached (detach.go), the descriptor is one
// opened by file handle for the borrower, which returnOpen closes.
func (n *node) borrowOpen(write bool) *openFile {
	if of := n.borrowHeld(write); of != nil {
		return of
	}
	return n.openDetached(write)
}

// borrowHeld is borrowOpen among the descriptors n's handles hold.
func (n *node) borrowHeld(write bool) *openFile {
	n.mu.Lock()
	defer n.mu.Unlock()
	var pick *openFile
	for of := range n.open {
		if pick == nil || (write && of.write) {
			pick = of
		}
		if !write || pick.write {
			break
		}
	}
	if pick != nil {
		pick.borrowers++
	}
	return pick
}

// returnOpen ends a borrowOpen (or a borrowPin); the last borrower of a
// released handle's descriptor (or a dropped pin) closes it.
func (n *node) returnOpen(of *openFile) {
	n.mu.Lock()
	of.borrowers--
	last := of.released && of.borrowers == 0
	n.mu.Unlock()
	if last {
		closeFd(of.fd)
	}
}

// openByName opens n's inode by one of its names with flags (O_PATH for
// inode operations), checking that the name still leads to n, and fills st
// with the attributes it checked (the inode's, as of the open). With no
// name left it fails with staleErr.
func (n *node) openByName(flags int, st *inodeStat) (int, error) {
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
		if err := fstat(fd, st); err != nil {
			closeFd(fd)
			return -1, err
		}
		if keyOf(st) == n.key {
			return fd, nil
		}
		closeFd(fd)
	}
	return -1, n.fs.staleErr(n)
}

// withFd calls fn with a descriptor of n's inode: an open handle's
// (exact even for an unlinked file), borrowed, if there is one, else an
// O_PATH descriptor found by name.
func (n *node) withFd(write bool, fn func(fd int) error) error {
	if of := n.borrowOpen(write); of != nil {
		defer n.returnOpen(of)
		return fn(of.fd)
	}
	var st inodeStat
	fd, err := n.openByName(unix.O_PATH, &st)
	if err != nil {
		return err
	}
	defer closeFd(fd)
	return fn(fd)
}
