package localbackend

import (
	"time"

	"golang.org/x/sys/unix"
)

// Kept shared claims: a released shared claim keeps its LOCK_SH for up to
// keepFor (Config.KeepShared, 5 ms by default), so that the next shared claim of the same backing file reuses it
// with no flock(2) at all. Taking a lock at depth 4 claims the four
// ancestors shared (and the lock itself); a program that locks and unlocks
// in a loop would otherwise flock and unlock each ancestor every time.
//
// A kept claim is a shared flock, so it never weakens exclusion; it only
// delays whoever wants the file exclusively:
//
//   - this daemon's own exclusive claim takes the kept descriptor, unlocks
//     it and flocks it exclusively at once (takeKept, claim.go): no self-delay;
//   - GuardTree (rename) and DropKept (asked by rmdir through the engine)
//     unlock every kept claim first, so neither sees a kept claim as held;
//   - anyone else (flock(1) on SOURCE, another daemon) waits at most keepFor
//     longer than the real holds make it: keepFor runs from the release that
//     first kept the claim, and reuses do not extend it (a claim reused
//     past its keepFor is unlocked at its next release), and a timer
//     unlocks expired ones. A non-blocking "flock -n" fails meanwhile, as
//     it would during a hold.
//
// A kept claim is not a lease: the engine has no hold on it, so status
// shows nothing, and it is never counted as held. A reused claim is checked
// after reuse like any grant (Backend.unnamed): it was held without the
// lock's ancestors, so a rename of an ancestor may have moved its file.
//
// Unlocked, a kept descriptor becomes an ordinary idle one (idle.go). At
// most keepMax claims are kept; Config.KeepShared sets keepFor.
const keepMax = 64

// keptFile is a released shared claim's descriptor, still holding LOCK_SH.
type keptFile struct {
	rel string
	backing
	since time.Time // the release that first kept it
}

// keep keeps the released shared lease l's LOCK_SH if the keep is enabled,
// there is room, and l's keepFor has not run out since it was first kept.
// It reports whether it kept it. Caller holds b.mu; b is open.
func (b *Backend) keep(l *lease, now time.Time) bool {
	since := l.keptSince
	if since.IsZero() {
		since = now
	}
	if b.keepFor <= 0 || len(b.kept) >= keepMax || now.Sub(since) >= b.keepFor {
		return false
	}
	if b.kept == nil {
		b.kept = make(map[string]*keptFile)
	}
	b.kept[l.rel] = &keptFile{rel: l.rel, backing: l.backing, since: since}
	if b.keepSweep == nil {
		b.keepSweep = time.AfterFunc(since.Add(b.keepFor).Sub(now), b.sweepKept)
	}
	return true
}

// DropKept unlocks every kept shared claim at once (lockmgr.KeptDropper):
// rmdir and rename through the mount call it before they test the backing
// files' flocks, so that no kept claim of this daemon looks held to them.
func (b *Backend) DropKept() {
	b.mu.Lock()
	all := make([]*keptFile, 0, len(b.kept))
	for _, k := range b.kept {
		all = append(all, k)
	}
	clear(b.kept)
	b.mu.Unlock()
	b.unkeep(all)
}

// sweepKept runs from b.keepSweep: it unlocks the kept claims whose keepFor
// ran out, and runs again while some are left. After Close it does nothing.
func (b *Backend) sweepKept() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.inflight.Add(1) // Close waits for it
	defer b.inflight.Done()
	now := time.Now()
	var expired []*keptFile
	var next time.Time
	for rel, k := range b.kept {
		end := k.since.Add(b.keepFor)
		if !now.Before(end) {
			expired = append(expired, k)
			delete(b.kept, rel)
		} else if next.IsZero() || end.Before(next) {
			next = end
		}
	}
	if next.IsZero() {
		b.keepSweep = nil
	} else {
		b.keepSweep.Reset(next.Sub(now))
	}
	b.mu.Unlock()
	b.unkeep(expired)
}

// unkeep unlocks kept descriptors and keeps them as idle ones.
func (b *Backend) unkeep(all []*keptFile) {
	for _, k := range all {
		if err := fdDo(k.file, func(fd int) error { return b.flockNB(fd, unix.LOCK_UN) }); err != nil {
			k.file.Close()
			continue
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			k.file.Close()
			continue
		}
		b.parkLocked(k.rel, k.backing)
	}
}
