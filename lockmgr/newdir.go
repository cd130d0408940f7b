package lockmgr

import (
	"context"
	"fmt"
	"path"
	"slices"
)

// AdoptNewDir implements the new-dir rule of SPEC §2: "creating a
// subdirectory under an exclusive new-dir lock gives the creator, in
// effect, an exclusive lock on the new directory". The FUSE layer calls it
// after thread tid created the directory name in parent. If tid's process
// or one of its ancestors holds parent's new-dir lock exclusively, the
// owner of that lock is granted the new directory's lock exclusively as
// well, released together with the new-dir lock. It reports whether it
// granted anything; a new directory that someone else locked first is
// left alone (ErrWouldBlock).
func (e *Engine) AdoptNewDir(ctx context.Context, parent, name string, tid int) (bool, error) {
	parent, err := CleanPath(parent)
	if err != nil {
		return false, fmt.Errorf("adopt new dir: %v: %w", err, ErrInvalid)
	}
	child := LockID{Path: path.Join(parent, name), Kind: KindDir} // path.Join(".", n) is n
	nd := LockID{Path: parent, Kind: KindNewDir}
	if !e.newDirHeld(nd) {
		return false, nil
	}
	// Read /proc without mu, then look again.
	lin, err := e.procs.Lineage(tid)
	if err != nil {
		return false, nil
	}
	e.mu.Lock()
	owner := e.newDirHolderLocked(nd, lin, LockID{})
	if owner == nil {
		e.mu.Unlock()
		return false, nil
	}
	// The new directory's lock is the new-dir lock's owner's: taken as
	// by the process that took that lock (while it lives) and through the
	// same control file (for its heirs, heirs.go), not as by the creator,
	// which is often a mkdir(1) that exits at once. Otherwise the holder's
	// lineage could not take the new directory's lock again, or one inside
	// it (lineage, SPEC §2.3), once the creator was gone.
	req := Request{Lock: child, Mode: Exclusive, Owner: owner.owner, TID: tid, UID: owner.uid, Ino: owner.ino}
	taker := 0
	if len(owner.lineage) > 0 && !e.exitedLocked(owner.lineage[0]) {
		taker = int(owner.tid)
	}
	e.mu.Unlock()
	if taker != 0 && taker != tid {
		if _, err := e.procs.Lineage(taker); err == nil {
			req.TID = taker
		}
	}
	if _, err := e.Acquire(ctx, req); err != nil {
		return false, fmt.Errorf("adopt new dir %s: %w", child, err)
	}
	e.mu.Lock()
	if ls := e.locks[nd]; ls != nil {
		if h := ls.holds.get(req.Owner); h != nil && h.explicit == Exclusive {
			f := h.setFate()
			f.adopted = append(f.adopted, child)
			e.mu.Unlock()
			return true, nil
		}
	}
	e.mu.Unlock()
	// The new-dir lock went away meanwhile: do not keep the child.
	_ = e.Release(context.WithoutCancel(ctx), child, req.Owner)
	return false, nil
}

// GiveUpAdopted lets the creator of a directory made under an exclusive
// new-dir lock remove it again within that lock (SPEC §2: the directory's
// lock came with the new-dir lock, it was never asked for). If the lock of
// parent/name was adopted by a new-dir hold of parent that belongs to tid's
// lineage, that lock is released now, ahead of the new-dir lock, and
// GiveUpAdopted reports true. The FUSE layer calls it before it removes the
// directory's backing files, so that the creator's own adopted lock does
// not make rmdir fail with EBUSY. Nobody else may create a subdirectory of
// parent meanwhile (that is what the new-dir lock says), so nobody else can
// come to hold a lock of that name while the creator removes it.
func (e *Engine) GiveUpAdopted(parent, name string, tid int) bool {
	parent, err := CleanPath(parent)
	if err != nil {
		return false
	}
	child := LockID{Path: path.Join(parent, name), Kind: KindDir}
	nd := LockID{Path: parent, Kind: KindNewDir}
	if !e.newDirHeld(nd) {
		return false
	}
	// Read /proc without mu, then look again.
	lin, err := e.procs.Lineage(tid)
	if err != nil {
		return false
	}
	defer e.endRelease(e.beginRelease())
	h := e.newDirHolderLocked(nd, lin, child)
	if h == nil {
		return false
	}
	if r := h.rare; r != nil && r.fate != nil {
		r.fate.adopted = slices.DeleteFunc(r.fate.adopted, func(id LockID) bool { return id == child })
	}
	e.releaseAdoptedDropsMu(child, h.owner)
	return true
}

// newDirHeld says whether anyone holds the new-dir lock nd exclusively:
// the cheap look before a lineage is read from /proc.
func (e *Engine) newDirHeld(nd LockID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	ls := e.locks[nd]
	return ls != nil && ls.nExclusive > 0
}

// newDirHolderLocked returns an exclusive hold of the new-dir lock nd that
// is not lost, belongs to lin and, unless adopted is the zero LockID, was
// given the lock adopted (AdoptNewDir); nil if none.
func (e *Engine) newDirHolderLocked(nd LockID, lin Lineage, adopted LockID) *hold {
	ls := e.locks[nd]
	if ls == nil {
		return nil
	}
	for _, h := range ls.holds.all() {
		if h.lostErr() != nil || h.explicit != Exclusive {
			continue
		}
		if adopted != (LockID{}) && !slices.Contains(h.fateOf().adopted, adopted) {
			continue
		}
		if e.belongsToLineageLocked(h, lin) {
			return h
		}
	}
	return nil
}
