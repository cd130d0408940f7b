package control

import (
	"context"
	"errors"

	"bazil.org/fuse"

	"github.com/lockfs/lockfs/lockmgr"
)

// The end of a lock on a control file: unlock, and the releases the
// kernel never asks for (Flush, Release; lock.go, # Release).

// Unlock releases the lock (LOCK_UN, F_UNLCK). Any byte range means the
// whole lock.
func (h *controlHandle) Unlock(ctx context.Context, req *fuse.UnlockRequest) error {
	return h.unlock(ctx, h.newCall("unlock", &req.Header, req.Lock, req.LockFlags, req.LockOwner))
}

func (h *controlHandle) unlock(ctx context.Context, call lockCall) error {
	id, ok := h.n.forget(call.owner)
	if !ok {
		id = call.id
	}
	if err := h.n.c.release(ctx, id, call.owner); err != nil {
		call.id = id
		return h.n.c.refuse(call, err)
	}
	return nil
}

// forget removes owner's record and returns the lock it asked for.
func (n *controlNode) forget(owner lockmgr.Owner) (lockmgr.LockID, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	rec, ok := n.owners.get(owner)
	if ok {
		n.owners.remove(owner)
		rec.h.dropOwnerLocked(owner)
	}
	return rec.id, ok
}

// Flush releases the closing process's POSIX locks on this control file.
func (h *controlHandle) Flush(ctx context.Context, req *fuse.FlushRequest) error {
	owner := posixOwner(req.LockOwner)
	id, ok := h.n.forget(owner)
	if !ok {
		return nil
	}
	if err := h.n.c.release(ctx, id, owner); err != nil {
		return h.n.c.refuse(lockCall{op: "flush", id: id, owner: owner, tid: int(req.Pid), uid: req.Uid}, err)
	}
	return nil
}

// Release ends the open file description: it releases the flock owner and
// every owner that last locked through this handle (OFD locks).
func (h *controlHandle) Release(ctx context.Context, req *fuse.ReleaseRequest) error {
	n := h.n
	var done []ownerRecord
	var owners []lockmgr.Owner
	n.mu.Lock()
	n.open--
	for _, o := range h.owners {
		if rec, ok := n.owners.get(o); ok && rec.h == h {
			done = append(done, rec)
			owners = append(owners, o)
			n.owners.remove(o)
		}
	}
	h.owners = nil
	n.mu.Unlock()
	var errs []error
	for i, rec := range done {
		n.c.logDeadHolder(rec.id, owners[i])
		if err := n.c.release(ctx, rec.id, owners[i]); err != nil {
			errs = append(errs, n.c.refuse(lockCall{op: "release", id: rec.id, owner: owners[i], uid: req.Uid}, err))
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// release gives back owner's lock id. It cannot be interrupted, never waits
// for other processes, and treats "not held" as done, as the kernel does.
func (c *Files) release(ctx context.Context, id lockmgr.LockID, owner lockmgr.Owner) error {
	err := c.engine.Release(context.WithoutCancel(ctx), id, owner)
	if err != nil && !errors.Is(err, lockmgr.ErrNotHeld) {
		return err
	}
	return nil
}
