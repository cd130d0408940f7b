package control

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/lockmgr"
)

// Lock requests on control files.
//
// # Owners
//
// flock(2) requests (LockFlags has LockFlock) belong to the open file
// description: the owner is Owner{OwnerFile, id} with the handle's own id,
// drawn from a counter at Open (bazil reuses handle IDs, and a flock
// LockOwner is a recyclable kernel pointer). Requests without LockFlock are
// POSIX record locks or OFD locks, which FUSE does not tell apart: both
// become Owner{OwnerPOSIX, LockOwner}. A POSIX owner is the process's file
// table, an OFD owner the open file description.
//
// # Release
//
// (release.go)
//
// The kernel never sends Unlock when a descriptor goes away; we release as
// it would:
//
//   - Flush (every close(2) of any descriptor of the file) releases the
//     closing process's POSIX owner, whichever handle of the node it locked
//     through: POSIX locks die at any close.
//   - Release (the last close of an open file description) releases the
//     handle's flock owner and every other owner that last locked through
//     this handle: that is where OFD locks die (their owner never appears
//     in a Flush). A POSIX owner is normally gone by then already.
//
// Flush and Release use context.WithoutCancel: a dying process gets an
// interrupt for each of its requests, its Flush included, and its locks
// must go all the same. They never wait for other processes.
//
// Known window: Release is asynchronous. If an OFD owner's address is
// reused by a new open file description that locks the same control file
// through another handle while the old handle's Release is in flight, the
// Release can drop the new lock. It needs a freed and reused kernel
// pointer within one round trip; we accept it.
//
// # Renames
//
// A lock is the lock of its directory's current path, and a directory
// with a lock held on it or below it is not renamed (EBUSY, fs/names.go). A
// request that waits holds nothing yet, though: the directory it opened
// may be renamed away, renamed back, or replaced by another while it
// waits (typically under the parent's exclusive lock, which the request
// waits for). The request follows the directory it opened: after the
// engine answers, it looks where the directory is now (Dir.WhereNow, in
// step with renames through the mount). Granted under a path the
// directory has left, it gives that lock back and asks again at the new
// path; refused because its claim found no directory (the backend's
// error wraps os.ErrNotExist), it asks again at the new path, or fails
// with ENOENT if the directory is gone (removed, or moved outside the
// mount where the daemon cannot follow it). It never answers EIO for
// that. See docs/PROTOCOL.md, "Renames during a wait".
//
// # Errors
//
// lockErrno maps every error of a lock call to its errno (SPEC §3), and
// refuse logs each refused or failed request once.

var (
	_ fusefs.HandleLocker           = (*controlHandle)(nil)
	_ fusefs.HandleLockWaitDeferrer = (*controlHandle)(nil)
	_ fusefs.HandleFlockLocker      = (*controlHandle)(nil)
	_ fusefs.HandlePOSIXLocker      = (*controlHandle)(nil)
)

// errPermission reports that the requester may not take the lock in the
// mode it asked for (EACCES).
var errPermission = errors.New("permission denied on the directory")

// lockCall describes one lock request, for the engine and for the log.
type lockCall struct {
	op    string
	id    lockmgr.LockID
	mode  lockmgr.Mode
	owner lockmgr.Owner
	tid   int    // the requesting thread (Header.Pid)
	pid   int    // the requesting process, when the kernel says (Lock.PID)
	uid   uint32 // Header.Uid (the fsuid)
	gid   uint32 // Header.Gid (the fsgid)
}

func (h *controlHandle) newCall(op string, hdr *fuse.Header, lk fuse.FileLock, flags fuse.LockFlags, owner fuse.LockOwner) lockCall {
	return lockCall{
		op:    op,
		id:    h.n.lockID(),
		owner: h.lockOwner(flags, owner),
		tid:   int(hdr.Pid),
		pid:   int(lk.PID),
		uid:   hdr.Uid,
		gid:   hdr.Gid,
	}
}

// lockID is the lock this control file takes now. It is computed from the
// directory node at each request, so that it follows a renamed directory.
func (n *controlNode) lockID() lockmgr.LockID {
	return lockmgr.LockID{Path: n.dir.LockPath(), Kind: n.kind}
}

// lockOwner maps a request's lock family and kernel owner to the engine's
// owner (see # Owners).
func (h *controlHandle) lockOwner(flags fuse.LockFlags, owner fuse.LockOwner) lockmgr.Owner {
	if flags&fuse.LockFlock != 0 {
		return h.owner
	}
	return posixOwner(owner)
}

func posixOwner(owner fuse.LockOwner) lockmgr.Owner {
	return lockmgr.Owner{Class: lockmgr.OwnerPOSIX, ID: uint64(owner)}
}

// lockMode maps a lock type to a mode.
func lockMode(t fuse.LockType) (lockmgr.Mode, error) {
	switch t {
	case fuse.LockRead:
		return lockmgr.Shared, nil
	case fuse.LockWrite:
		return lockmgr.Exclusive, nil
	}
	return 0, fmt.Errorf("lock type %d: %w", t, lockmgr.ErrInvalid)
}

// Lock takes the lock without waiting (LOCK_NB, F_SETLK).
func (h *controlHandle) Lock(ctx context.Context, req *fuse.LockRequest) error {
	return h.lock(ctx, req, false)
}

// LockWait takes the lock, waiting until it is granted or the request is
// interrupted (LOCK_EX, F_SETLKW). The server calls LockWaitDeferred
// instead; LockWait is the same on the calling goroutine.
func (h *controlHandle) LockWait(ctx context.Context, req *fuse.LockWaitRequest) error {
	return h.lock(ctx, (*fuse.LockRequest)(req), true)
}

// LockWaitDeferred is LockWait without a goroutine that waits for the
// grant (fusefs.HandleLockWaitDeferrer): a request queued behind a holder
// is parked in the engine (lockmgr.Engine.AcquireAsync), and answer is
// called when the engine grants it, fails it, or its interrupt cancels
// ctx. 10,000 waiting flock(2) calls then cost no goroutine stack each.
func (h *controlHandle) LockWaitDeferred(ctx context.Context, req *fuse.LockWaitRequest, answer func(error)) {
	if !parkLockWaits {
		answer(h.LockWait(ctx, req))
		return
	}
	lockReq := (*fuse.LockRequest)(req)
	call, err := h.admit(ctx, lockReq, true)
	if err != nil || lockReq.Lock.Type == fuse.LockUnlock {
		answer(err)
		return
	}
	h.acquireAsync(ctx, &call, 0, func(err error) {
		answer(h.granted(call, err))
	})
}

func (h *controlHandle) lock(ctx context.Context, req *fuse.LockRequest, wait bool) error {
	call, err := h.admit(ctx, req, wait)
	if err != nil || req.Lock.Type == fuse.LockUnlock {
		return err
	}
	err = h.acquire(ctx, &call, wait) // sets call.id, which granted logs
	return h.granted(call, err)
}

// admit describes a lock request and checks it before it goes to the
// engine: an unlock is done at once (its result is returned), a bad mode
// or a refused permission is refused (logged and returned).
func (h *controlHandle) admit(ctx context.Context, req *fuse.LockRequest, wait bool) (lockCall, error) {
	op := "lock"
	if wait {
		op = "lockwait"
	}
	call := h.newCall(op, &req.Header, req.Lock, req.LockFlags, req.LockOwner)
	if req.Lock.Type == fuse.LockUnlock {
		return call, h.unlock(ctx, call)
	}
	c := h.n.c
	mode, err := lockMode(req.Lock.Type)
	call.mode = mode
	if err != nil {
		return call, c.refuse(call, err)
	}
	if err := h.n.permit(ctx, call); err != nil {
		if c.obs != nil {
			c.obs.Requested(lockmgr.Request{Lock: call.id, Mode: mode, Owner: call.owner, TID: call.tid, UID: call.uid, Wait: wait},
				lockmgr.Grant{}, lockmgr.Denied, 0)
		}
		return call, c.refuse(call, err)
	}
	return call, nil
}

// permit checks the requester's permission on the directory (SPEC §3): a
// shared lock needs read permission, an exclusive one (and so every usage
// lock) write permission. Root may take any lock.
func (n *controlNode) permit(ctx context.Context, call lockCall) error {
	if call.uid == 0 {
		return nil
	}
	need := uint32(4) // r
	if call.mode == lockmgr.Exclusive || n.kind == lockmgr.KindUsage {
		need = 2 // w
	}
	var a fuse.Attr
	if err := n.dir.Attr(ctx, &a); err != nil {
		return fmt.Errorf("directory attributes: %w", err)
	}
	perm := uint32(a.Mode.Perm())
	var bits uint32
	switch {
	case call.uid == a.Uid:
		bits = perm >> 6
	case call.gid == a.Gid || procinfo.InGroups("", call.tid, a.Gid):
		bits = perm >> 3
	default:
		bits = perm
	}
	if bits&need == 0 {
		return fmt.Errorf("%s lock needs %s permission on %q: %w",
			call.mode, map[uint32]string{4: "read", 2: "write"}[need], call.id.Path, errPermission)
	}
	return nil
}

// granted finishes a request the engine answered with err: a refusal is
// logged and returned; a grant of a directory lock revalidates the
// directory's cached children.
func (h *controlHandle) granted(call lockCall, err error) error {
	if err != nil {
		return h.n.c.refuse(call, err)
	}
	if h.n.kind == lockmgr.KindDir || h.n.kind == lockmgr.KindNewDir {
		h.n.dir.RevalidateChildren() // fs: invalidate.go
	}
	return nil
}

// acquire asks the engine for call's lock through h and follows h's
// directory if a rename through the mount moves it meanwhile (see
// # Renames): it sets call.id to the lock it finally asked for.
func (h *controlHandle) acquire(ctx context.Context, call *lockCall, wait bool) error {
	for stale := 0; ; {
		_, err := h.n.c.engine.Acquire(ctx, h.engineRequest(call, wait))
		if again, err := h.followed(ctx, call, err, &stale); !again {
			return err
		}
	}
}

// acquireAsync is acquire of a waiting request through the engine's
// AcquireAsync: then is called once with the outcome, on this goroutine
// or on the engine's. stale counts the claims that found no directory at
// an unchanged path (followed).
func (h *controlHandle) acquireAsync(ctx context.Context, call *lockCall, stale int, then func(error)) {
	h.n.c.engine.AcquireAsync(ctx, h.engineRequest(call, true), func(_ lockmgr.Grant, err error) {
		if again, err := h.followed(ctx, call, err, &stale); !again {
			then(err)
			return
		}
		h.acquireAsync(ctx, call, stale, then)
	})
}

// engineRequest records call's owner with h and returns the engine's
// request for call.
func (h *controlHandle) engineRequest(call *lockCall, wait bool) lockmgr.Request {
	// Remember the owner before asking: a Flush racing with the grant
	// then still finds it.
	h.n.remember(call.owner, h, call.id)
	return lockmgr.Request{
		Lock:  call.id,
		Mode:  call.mode,
		Owner: call.owner,
		TID:   call.tid,
		UID:   call.uid,
		Wait:  wait,
		Ino:   h.n.inode,
		// The token is issued when the holder (or lockfs status) reads
		// it, not on every grant: most flocks are never asked for it.
		DeferToken: true,
	}
}

// remember records that owner asks for lock id through handle h.
func (n *controlNode) remember(owner lockmgr.Owner, h *controlHandle, id lockmgr.LockID) {
	n.mu.Lock()
	if old, ok := n.owners.get(owner); !ok || old.h != h {
		if ok {
			old.h.dropOwnerLocked(owner)
		}
		h.owners = append(h.owners, owner)
	}
	n.owners.set(owner, ownerRecord{h: h, id: id})
	n.mu.Unlock()
}

// followed looks, after the engine answered call with err, whether h's
// directory moved meanwhile (see # Renames). again: ask again, at the
// path call.id now names; otherwise err is the request's outcome.
func (h *controlHandle) followed(ctx context.Context, call *lockCall, err error, stale *int) (again bool, _ error) {
	if !followRenames || (err != nil && !errors.Is(err, os.ErrNotExist)) {
		return false, err
	}
	c := h.n.c
	now, found := h.n.dir.WhereNow(err != nil)
	switch {
	case now == call.id.Path && err == nil:
		return false, nil
	case now != call.id.Path && err == nil:
		// Granted the lock of the path the directory has left, which
		// names another directory or nothing: give it back.
		if err := c.release(ctx, call.id, call.owner); err != nil {
			return false, err
		}
	case now != call.id.Path:
		// The claim found nothing at the old path.
	case found && *stale < maxStaleClaims:
		// Not found at a path where the directory is now: it moved
		// away and back between the claim and this look.
		*stale++
	default:
		return false, fmt.Errorf("directory %s is gone: %w", now, err)
	}
	c.log.WithFields(logrus.Fields{"from": call.id.Path, "to": now, "kind": call.id.Kind.String(), "tid": call.tid}).
		Debug("the directory of a lock request moved while it waited: asking again where it is now")
	call.id.Path = now
	return true, nil
}

// parkLockWaits: LockWaitDeferred parks a waiting request in the engine.
// A variable only so that a test's control can wait on the serving
// goroutine instead, as LockWait does.
var parkLockWaits = true

// maxStaleClaims bounds how often one request asks again at an unchanged
// path after its claim found no directory there while the directory is
// found there afterwards (moved away and back meanwhile).
const maxStaleClaims = 8

// followRenames makes a lock request follow its directory when a rename
// moves it meanwhile (acquire). A variable only so that a test's control
// can run the old path, which asked once under the path of the request's
// start.
var followRenames = true

// QueryLock answers F_GETLK: the holder that would block a request of this
// owner in this mode, if any, as a whole-file lock.
func (h *controlHandle) QueryLock(ctx context.Context, req *fuse.QueryLockRequest, resp *fuse.QueryLockResponse) error {
	call := h.newCall("querylock", &req.Header, req.Lock, req.LockFlags, req.LockOwner)
	c := h.n.c
	mode, err := lockMode(req.Lock.Type)
	call.mode = mode
	if err == nil && call.id.Kind == lockmgr.KindUsage && mode != lockmgr.Exclusive {
		err = fmt.Errorf("usage lock is exclusive only: %w", lockmgr.ErrInvalid)
	}
	if err != nil {
		return c.refuse(call, err)
	}
	holder, ok := c.engine.Query(lockmgr.Request{
		Lock: call.id, Mode: mode, Owner: call.owner, TID: call.tid, UID: call.uid,
	})
	if !ok {
		return nil // resp is prefilled with F_UNLCK
	}
	typ := fuse.LockRead
	if holder.Mode == lockmgr.Exclusive {
		typ = fuse.LockWrite
	}
	pid := int32(holder.Process.PID)
	if pid == 0 {
		pid = -1 // unknown, as for OFD locks
	}
	resp.Lock = fuse.FileLock{Start: 0, End: math.MaxInt64, Type: typ, PID: pid}
	return nil
}
