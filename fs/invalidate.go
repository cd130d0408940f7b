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
