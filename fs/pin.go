package fs

import (
	"strings"
	"sync"
)

// Descriptors kept for directories at the top of SOURCE.
//
// Every operation on a name in a directory opens the directory by its
// path (openat2 beneath rootFd), checks its inode and closes it again
// (Dir.at): three system calls per lookup, create or removal. For a
// directory whose only name is in SOURCE's top directory, the O_PATH
// descriptor that the first operation opened is kept instead (a pin), and
// each later operation checks it with one statx of the name beneath
// rootFd, not following a symlink: if the name still leads to the pinned
// inode, the operation runs in the pinned descriptor. That is what the
// fresh open would give: a descriptor of the inode the path named when it
// was checked, beneath SOURCE (with no directory between rootFd and the
// name, a single-name lookup follows no symlink and cannot leave it). A
// name that leads elsewhere drops the pin, and the full lookup decides.
// Deeper directories are not pinned: a statx of a longer path would follow
// a symlink put in it.
//
// A pin is dropped when the kernel forgets the directory, when its name
// is no longer a top-level one (a rename through the mount), and when the
// mount closes. At most maxPins directories are pinned per mount, so the
// descriptors they hold stay few beside the lock backend's.

// maxPins is how many directories one mount pins at most.
const maxPins = 64

// pinSet is a mount's pinned directories.
type pinSet struct {
	mu sync.Mutex
	// nodes holds every node with a pin. GUARDED_BY(mu)
	nodes map[*node]struct{}
	// closed is set at the mount's Close: no new pin. GUARDED_BY(mu)
	closed bool
}

// pinChecked is whether a pin is checked against its name before use. A
// variable only so that a test's control can leave the check out.
var pinChecked = true

// topName returns n's name if it is the only one and in SOURCE's top
// directory (not the root itself).
func (n *node) topName() (string, bool) {
	ps := n.paths()
	if len(ps) != 1 || ps[0] == "." || strings.IndexByte(ps[0], '/') >= 0 {
		return "", false
	}
	return ps[0], true
}

// borrowPin returns n's pin, borrowed (returnOpen ends it, as for a
// handle's descriptor), after checking that name still leads to its inode;
// st gets the inode's attributes. nil: no pin, or the name leads elsewhere
// now (the pin is dropped).
func (n *node) borrowPin(name string, st *inodeStat) *openFile {
	n.mu.Lock()
	of := n.pin
	if of != nil {
		of.borrowers++
	}
	n.mu.Unlock()
	if of == nil {
		return nil
	}
	if !pinChecked {
		if fstat(of.fd, st) == nil {
			return of
		}
	} else if n.lstatTop(name, st) == nil {
		return of
	}
	n.returnOpen(of)
	n.dropPin()
	return nil
}

// keepPin makes fd, a checked O_PATH descriptor of n that the caller is
// using, n's pin, if n has none and the mount has room. It returns the
// pin, borrowed by the caller (returnOpen), or nil if fd was not kept (the
// caller closes it).
func (n *node) keepPin(fd int) *openFile {
	s := &n.fs.pins
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.nodes) >= maxPins {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pin != nil || n.unpinnable {
		return nil
	}
	of := &openFile{fd: fd, borrowers: 1}
	n.pin = of
	if s.nodes == nil {
		s.nodes = make(map[*node]struct{})
	}
	s.nodes[n] = struct{}{}
	return of
}

// dropPin drops n's pin, if it has one: closed now, or by its last user.
func (n *node) dropPin() {
	n.mu.Lock()
	has := n.pin != nil
	n.mu.Unlock()
	if !has {
		return
	}
	s := &n.fs.pins
	s.mu.Lock()
	n.mu.Lock()
	of := n.pin
	n.pin = nil
	delete(s.nodes, n)
	last := false
	if of != nil {
		of.released = true
		last = of.borrowers == 0
	}
	n.mu.Unlock()
	s.mu.Unlock()
	if last {
		closeFd(of.fd)
	}
}

// forgetPin drops n's pin for good: the kernel has forgotten n.
func (n *node) forgetPin() {
	n.mu.Lock()
	n.unpinnable = true
	n.mu.Unlock()
	n.dropPin()
}

// closePins drops every pin at the mount's end.
func (f *FS) closePins() {
	f.pins.mu.Lock()
	f.pins.closed = true
	nodes := make([]*node, 0, len(f.pins.nodes))
	for n := range f.pins.nodes {
		nodes = append(nodes, n)
	}
	f.pins.mu.Unlock()
	for _, n := range nodes {
		n.dropPin()
	}
}

// pinCount is how many directories are pinned (tests).
func (f *FS) pinCount() int {
	f.pins.mu.Lock()
	defer f.pins.mu.Unlock()
	return len(f.pins.nodes)
}
