package fs

import (
	"errors"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
)

// invalidateAttr drops the kernel's cached attributes of n (a negative
// offset: attributes only; offset 0 would drop every cached page too).
func (f *FS) invalidateAttr(n fusefs.Node) {
	srv := f.server.Load()
	if srv == nil {
		return
	}
	if err := srv.InvalidateNodeDataRange(n, -1, 0); err != nil && !errors.Is(err, fuse.ErrNotCached) {
		f.log.WithError(err).Warn("invalidating the kernel's attributes of a file")
	}
}

// invalidateData drops the kernel's cached pages and attributes of n. A
// node the kernel does not know has nothing cached.
func (f *FS) invalidateData(n fusefs.Node) {
	srv := f.server.Load()
	if srv == nil {
		return
	}
	if err := srv.InvalidateNodeData(n); err != nil && !errors.Is(err, fuse.ErrNotCached) {
		f.log.WithError(err).Warn("invalidating the kernel's cache of a file")
	}
}

// A directory lock guards the immediate children of its directory (SPEC
// §2): their names and attributes are whatever SOURCE has when the lock
// is granted. The kernel may have kept them from before (entryValid,
// fileAttrValid), changed since by another mount or in SOURCE: a granted
// directory or new-dir lock drops them.
//
// It drops only what the kernel may still hold from before. Every answer
// that gives the kernel a node's attributes or a name for it takes a
// number from one counter (FS.given, node.givenGen: fillAttr), and a
// revalidation of D notes the counter when it starts. What the kernel
// got before a revalidation of D began was dropped by it, and the kernel
// keeps nothing of a node after the drop but what later answers give it.
// So a revalidation drops the child names and attributes (and D's own)
// given since the start of the revalidation before the previous one: one
// round more than needed, for an answer that the daemon had written when
// a revalidation started but that the kernel took in only after it (the
// kernel discards attributes from such a late answer, and a dropped name
// is unhashed, but the extra round costs little). A lock taken and
// released in a loop with nobody looking at D's children sends nothing
// after the second grant; each child looked at since costs two
// notifications at each of the next two grants.

// dirChild is a name in a directory and the node the kernel knows by it.
type dirChild struct {
	n    passNode
	name string
	gen  uint64 // the node's givenGen
}

// knownChildren returns the nodes that the daemon knows under a name in d.
func (d *Dir) knownChildren() []dirChild {
	d.fs.treeMu.RLock()
	out := make([]dirChild, 0, len(d.children))
	for c := range d.children {
		for _, l := range c.links {
			if l.dir == d {
				out = append(out, dirChild{n: c.self, name: l.name})
			}
		}
	}
	d.fs.treeMu.RUnlock()
	for i := range out {
		c := out[i].n.base()
		c.mu.Lock()
		out[i].gen = c.givenGen
		c.mu.Unlock()
	}
	return out
}

// RevalidateChildren drops the kernel's names and attributes of d's
// children, and d's own attributes, that it may hold from before a
// directory lock granted on d (see above).
func (d *Dir) RevalidateChildren() {
	srv := d.fs.server.Load()
	if srv == nil || d.fs.cfg.KeepCacheUnsafe {
		return
	}
	start := d.fs.given.Load()
	d.mu.Lock()
	since := d.revalGens[0]
	d.revalGens = [2]uint64{d.revalGens[1], max(d.revalGens[1], start)}
	self := d.givenGen
	d.mu.Unlock()
	for _, c := range d.knownChildren() {
		if c.gen <= since {
			continue
		}
		if err := srv.InvalidateEntry(d, c.name); err != nil && !errors.Is(err, fuse.ErrNotCached) {
			d.fs.log.WithError(err).Warn("invalidating the kernel's name of a file")
		}
		d.fs.invalidateAttr(c.n)
	}
	if self > since {
		d.fs.invalidateAttr(d)
	}
}
