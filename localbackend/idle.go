package localbackend

import (
	"container/list"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Idle descriptors: a released claim's open file description is unlocked
// (LOCK_UN) at once, and kept for a short while so that the next claim of
// the same backing file can flock it again instead of resolving the path
// and opening the file anew. Taking a lock at depth 4 claims five backing
// files (four shared ancestors and the lock itself); a program that locks
// and unlocks in a loop reclaims all five every time.
//
// Reuse is no weaker than a fresh open: the descriptor holds no lock while
// idle, it is reused only within idleReuse of its release (as if it had been
// opened that much earlier), and a flock granted on it is checked like any
// other: if the file was removed meanwhile (rmdir through the mount, or
// directly in SOURCE), the claim drops it and opens the name again.
// Expired descriptors are closed at the next claim or release, or by a
// sweep idleReuse after the set stopped being empty, so that a quiet daemon
// keeps no backing file open that it does not lock (lsof shows what is
// really in use). At most idleMax stay open.
const (
	idleReuse = 20 * time.Millisecond
	idleMax   = 256
)

// idleFile is one unlocked descriptor of a released claim.
type idleFile struct {
	rel string
	backing
	since time.Time // when it was released
}

// idleSet is the set of idle descriptors, oldest first. It is guarded by
// Backend.mu.
type idleSet struct {
	// reuse is how long a descriptor may be reused after its release:
	// idleReuse (tests set it before the first claim).
	reuse time.Duration
	byRel map[string]*list.Element // of *idleFile
	order list.List                // of *idleFile, oldest at the front
}

// take removes and returns rel's idle descriptor, if any, and appends to
// expired the ones too old to keep; the caller closes those after
// unlocking. Caller holds Backend.mu.
func (s *idleSet) take(rel string, now time.Time, expired []*os.File) (*idleFile, []*os.File) {
	expired = s.expire(now, expired)
	e, ok := s.byRel[rel]
	if !ok {
		return nil, expired
	}
	delete(s.byRel, rel)
	return s.order.Remove(e).(*idleFile), expired
}

// put adds an idle descriptor, replacing one of the same file, and appends
// the ones it displaces or that expired to expired. Caller holds
// Backend.mu.
func (s *idleSet) put(f *idleFile, expired []*os.File) []*os.File {
	if s.byRel == nil {
		s.byRel = make(map[string]*list.Element)
	}
	if e, ok := s.byRel[f.rel]; ok {
		expired = append(expired, s.order.Remove(e).(*idleFile).file)
	}
	s.byRel[f.rel] = s.order.PushBack(f)
	return s.expire(f.since, expired)
}

// expire drops the descriptors released more than idleReuse before now,
// and the oldest ones beyond idleMax. Caller holds Backend.mu.
func (s *idleSet) expire(now time.Time, expired []*os.File) []*os.File {
	for e := s.order.Front(); e != nil; e = s.order.Front() {
		f := e.Value.(*idleFile)
		if s.order.Len() <= idleMax && now.Sub(f.since) <= s.reuse {
			break
		}
		s.order.Remove(e)
		delete(s.byRel, f.rel)
		expired = append(expired, f.file)
	}
	return expired
}

// drain removes every idle descriptor and returns them for closing.
// Caller holds Backend.mu.
func (s *idleSet) drain() []*os.File {
	var all []*os.File
	for e := s.order.Front(); e != nil; e = e.Next() {
		all = append(all, e.Value.(*idleFile).file)
	}
	s.order.Init()
	clear(s.byRel)
	return all
}

// takeIdle returns rel's idle descriptor, if one was released within
// idleReuse and the backend is open, and closes the expired ones. Whether
// its file still has a name is checked after the flock is granted, as for
// a fresh open (Backend.claim).
func (b *Backend) takeIdle(rel string) (backing, bool) {
	b.mu.Lock()
	f, expired := b.idle.take(rel, time.Now(), nil)
	b.mu.Unlock()
	closeAll(expired)
	if f == nil {
		return backing{}, false
	}
	return f.backing, true
}

// putIdle forgets the released lease l and keeps its shared flock (keep.go)
// if shared and the keep allows; else it unlocks its descriptor and keeps
// it for reuse; if unlocking fails or the backend is closed, it closes it
// instead.
func (b *Backend) putIdle(l *lease, shared bool) {
	if shared {
		b.mu.Lock()
		if !b.closed && b.keep(l, time.Now()) {
			delete(b.leases, l)
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
	}
	if err := fdDo(l.file, func(fd int) error { return b.flockNB(fd, unix.LOCK_UN) }); err != nil {
		b.forget(l)
		l.file.Close()
		return
	}
	b.mu.Lock()
	delete(b.leases, l)
	if b.closed {
		b.mu.Unlock()
		l.file.Close()
		return
	}
	b.parkLocked(l.rel, l.backing)
}

// parkLocked keeps an unlocked descriptor of rel for reuse, starts the
// sweep that closes it once expired, unlocks b.mu and closes what the pool
// let go. Called with b.mu held and b not closed.
func (b *Backend) parkLocked(rel string, bk backing) {
	expired := b.idle.put(&idleFile{rel: rel, backing: bk, since: time.Now()}, nil)
	if b.idleSweep == nil {
		b.idleSweep = time.AfterFunc(b.idle.reuse, b.sweepIdle)
	}
	b.mu.Unlock()
	closeAll(expired)
}

// sweepIdle runs from b.idleSweep: it closes the expired idle descriptors
// and runs again while some are left. After Close it does nothing (Close
// stops the timer and closes every idle descriptor itself).
func (b *Backend) sweepIdle() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.inflight.Add(1) // Close waits for it
	defer b.inflight.Done()
	now := time.Now()
	expired := b.idle.expire(now, nil)
	if e := b.idle.order.Front(); e != nil {
		b.idleSweep.Reset(e.Value.(*idleFile).since.Add(b.idle.reuse).Sub(now) + time.Millisecond)
	} else {
		b.idleSweep = nil
	}
	b.mu.Unlock()
	closeAll(expired)
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
