package fs

import (
	"sync"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"
)

// Deadlock detection for byte-range locks on ordinary files (SPEC §1: a
// cycle of F_SETLKW waits fails with EDEADLK, as on a local file system).
//
// The nodes of the graph are lock owners (a process's POSIX owner, or an
// open file description for OFD locks), as in the kernel. A waiting owner
// has one edge: to the owner of the lock that its last attempt ran into
// (F_OFD_GETLK through its own carrier names the lock; ofdOwner names its
// owner). Each attempt records that edge and follows the chain of waiting
// owners; if the chain comes back to the waiter, the waiter is refused
// with EDEADLK and leaves the graph at once, under the graph's lock, so
// that of the owners in a cycle exactly one is refused. Like the kernel,
// the walk follows one blocker per owner and gives up after
// maxDeadlockHops. A lock held by a program on SOURCE directly, outside
// the mount, ends every chain: its owner cannot be seen.

// maxDeadlockHops bounds the walk, as the kernel's MAX_DEADLK_ITERATIONS.
const maxDeadlockHops = 10

// rangeWaits is the wait-for graph of byte-range lock waits.
type rangeWaits struct {
	mu sync.Mutex
	// blocker maps a waiting owner to the owner it waits for.
	// GUARDED_BY(mu)
	blocker map[fuse.LockOwner]fuse.LockOwner
}

// wait records that owner waits for blocker and reports whether that
// closes a cycle; if it does, owner leaves the graph.
func (g *rangeWaits) wait(owner, blocker fuse.LockOwner) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.blocker == nil {
		g.blocker = make(map[fuse.LockOwner]fuse.LockOwner)
	}
	g.blocker[owner] = blocker
	b := blocker
	for range maxDeadlockHops {
		if b == owner {
			delete(g.blocker, owner)
			return true
		}
		next, ok := g.blocker[b]
		if !ok {
			return false
		}
		b = next
	}
	return false
}

// done removes owner from the graph: its wait ended.
func (g *rangeWaits) done(owner fuse.LockOwner) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.blocker, owner)
}

// closesCycle finds the owner of the lock that byte-range request r ran
// into and reports whether waiting for it closes a cycle of waits.
func (h *fileHandle) closesCycle(r *fuse.LockRequest) bool {
	f := h.n.fs
	lk := flockT(r.Lock, r.Lock.Type)
	f.ownersMu.Lock()
	o := f.owners[ownerKey{inode: h.key, owner: r.LockOwner}]
	f.ownersMu.Unlock()
	if o == nil {
		return false
	}
	ok, err := o.do(func(fd int) error { return unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk) })
	if !ok || err != nil || lk.Type == unix.F_UNLCK {
		f.rangeWaits.done(r.LockOwner)
		return false
	}
	holder := f.ofdOwner(h.key, r.LockOwner, lk)
	if holder == nil {
		f.rangeWaits.done(r.LockOwner)
		return false
	}
	return f.rangeWaits.wait(r.LockOwner, holder.key.owner)
}
