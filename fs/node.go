package fs

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	fusefs "bazil.org/fuse/fs"
	"golang.org/x/sys/unix"
)

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
	// self is the *File or *Dir this node is part of: the node bazil
	// knows.
	self passNode

	// Mutable state

	// links are the names the inode is known by, newest first: one for a
	// directory, possibly several for a file with hard links, none for the
	// root. A name may be stale (removed or replaced in SOURCE); every use
	// checks that it still leads to key. GUARDED_BY(fs.treeMu)
	links []link
	// lastLink is the last name of a node that has none left, for
	// messages. GUARDED_BY(fs.treeMu)
	lastLink link
	// children are, for a directory, the nodes with a link into it, for
	// the directory lock's revalidation (invalidate.go). INVARIANT: c is in
	// d.children iff one of c.links has dir d, or c was forgotten.
	// GUARDED_BY(fs.treeMu)
	children map[*node]struct{}

	// seen is when a lookup last found the node (UnixNano).
	seen atomic.Int64
	// opened is set when the node is opened, cleared by a lookup.
	opened atomic.Bool
	// vanished is set when staleErr answers ENOENT, cleared by a lookup.
	vanished atomic.Bool

	mu sync.Mutex
	// open holds the backing descriptors of the node's open handles.
	// A handle leaves the set when it is released; its descriptor is
	// closed then, or by its last borrower (borrowOpen). GUARDED_BY(mu)
	open map[*openFile]struct{}
	// givenGen is the FS.given value of the last answer that gave the
	// kernel n's attributes or a name for n (fillAttr). GUARDED_BY(mu)
	givenGen uint64
	// revalGens are, for a directory, the FS.given values at the start
	// of its last two revalidations, older first (invalidate.go).
	// GUARDED_BY(mu)
	revalGens [2]uint64
	// pin is a directory's kept descriptor (pin.go); unpinnable is set
	// once the kernel forgot the node. GUARDED_BY(mu)
	pin *openFile
	// detached counts the open handles that keep no descriptor, and fh,
	// valid if fhOK, is the inode's file handle they are found by
	// (detach.go). GUARDED_BY(mu)
	fh unix.FileHandle
	// detached, unpinnable and fhOK share one word: a node is then 192
	// bytes, a size class below 208 (a directory node per held lock).
	detached   int32
	unpinnable bool
	fhOK       bool
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

// LockPath returns d's path in the engine's form ("." for the root): the
// path of the locks its control files take. relPath's paths are in that
// form already: every name in them passed checkName.
func (d *Dir) LockPath() string {
	return d.relPath()
}

// WhereNow returns d's path now, in the engine's form, for a lock request
// that may have waited while d moved (control/lock.go, # Renames). If checkFound,
// found reports whether SOURCE has d's inode at that path. It waits for a
// rename of a directory through the mount that is under way (moveMu), so
// that it sees d either where it was before or where it is after.
func (d *Dir) WhereNow(checkFound bool) (path string, found bool) {
	d.fs.moveMu.RLock()
	defer d.fs.moveMu.RUnlock()
	rel := d.relPath()
	if !checkFound || d == d.fs.root {
		return rel, true
	}
	fd, err := openBeneath(d.fs.rootFd, rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return rel, false
	}
	defer closeFd(fd)
	var st inodeStat
	return rel, fstat(fd, &st) == nil && keyOf(&st) == d.key
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

// setLinksLocked sets n's links to ls and keeps the directories' children
// sets in step. Call with fs.treeMu held.
func (n *node) setLinksLocked(ls []link) {
	for _, l := range n.links {
		delete(l.dir.children, n)
	}
	n.links = ls
	for _, l := range ls {
		if l.dir.children == nil {
			l.dir.children = make(map[*node]struct{})
		}
		l.dir.children[n] = struct{}{}
	}
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
		n.setLinksLocked([]link{l})
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
	n.setLinksLocked(ls)
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
			n.setLinksLocked(append(n.links[:i:i], n.links[i+1:]...))
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
		n.setLinksLocked([]link{nl})
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
	n.setLinksLocked(ls)
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
			d := &Dir{node: node{fs: f, key: key, ftype: ftype}}
			d.self = d
			n = d
		} else {
			fl := &File{node: node{fs: f, key: key, ftype: ftype}}
			fl.self = fl
			n = fl
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
	cur, ok := n.fs.nodes[n.key]
	forgot := ok && cur.base() == n && n != &n.fs.root.node
	if forgot {
		delete(n.fs.nodes, n.key)
	}
	n.fs.nodesMu.Unlock()
	if n.ftype == unix.S_IFDIR {
		n.forgetPin()
	}
	if forgot {
		n.fs.treeMu.Lock()
		for _, l := range n.links {
			delete(l.dir.children, n)
		}
		n.fs.treeMu.Unlock()
		n.fs.noteForget()
	}
}
