package fs

import (
	"syscall"
	"time"
)

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
