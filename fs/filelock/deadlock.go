package filelock

import (
	"errors"
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
//
// The graph and the locks must move together, or a wait recorded a moment
// ago stands for a lock that is gone: an owner granted at its last attempt
// would still seem to wait for the owner it waited for, and an owner that
// has just let go would still seem to block its waiters, and either makes
// a cycle out of no deadlock (stress-ng's fcntl stressor, two processes
// taking turns at one range of one file, got EDEADLK several times a
// second). So mu is held across every change of a byte-range lock (a
// carrier's F_OFD_SETLK, a carrier's close) and across each check
// (closesCycle), and a change drops the waits it may end, as the kernel's
// unlock wakes its blocked waiters: the waits for the owner that changed
// (each is recorded again at its next attempt if it still runs into that
// owner), and the owner's own when its wait is granted.
type rangeWaits struct {
	mu sync.Mutex
	// blocker maps a waiting owner to the owner it waits for.
	// GUARDED_BY(mu)
	blocker map[fuse.LockOwner]fuse.LockOwner
}

// errCarrierClosed: the carrier was closed under a change (a concurrent
// Flush); the change did not happen.
var errCarrierClosed = errors.New("lock carrier closed")

// change runs fn, a change of owner's byte-range locks, under the graph's
// lock. If it succeeds, the waits for owner are dropped, and owner's own
// wait if ends: the change granted it.
func (g *rangeWaits) change(owner fuse.LockOwner, ends bool, fn func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := fn()
	if err != nil {
		return err
	}
	for w, b := range g.blocker {
		if b == owner {
			delete(g.blocker, w)
		}
	}
	if ends {
		delete(g.blocker, owner)
	}
	return nil
}

// waitLocked records that owner waits for blocker and reports whether that
// closes a cycle; if it does, owner leaves the graph.
func (g *rangeWaits) waitLocked(owner, blocker fuse.LockOwner) bool {
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
// into and reports whether waiting for it closes a cycle of waits. It runs
// under the graph's lock: no lock changes between what it sees and what it
// records.
func (t *Table) closesCycle(h File, r *fuse.LockRequest) bool {
	g := &t.waits
	g.mu.Lock()
	defer g.mu.Unlock()
	lk := flockT(r.Lock, r.Lock.Type)
	t.ownersMu.Lock()
	o := t.owners[ownerKey{inode: h.Inode(), owner: r.LockOwner}]
	t.ownersMu.Unlock()
	if o == nil {
		return false
	}
	ok, err := o.do(func(fd int) error { return unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk) })
	if !ok || err != nil || lk.Type == unix.F_UNLCK {
		delete(g.blocker, r.LockOwner)
		return false
	}
	holder := t.ofdOwner(h.Inode(), r.LockOwner, lk)
	if holder == nil {
		delete(g.blocker, r.LockOwner)
		return false
	}
	return g.waitLocked(r.LockOwner, holder.key.owner)
}
