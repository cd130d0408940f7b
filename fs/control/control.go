package control

import (
	"context"
	"strings"
	"sync"
	"syscall"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"

	"github.com/lockfs/lockfs/lockmgr"
)

// Control files.
//
// Every directory shows .lock, .lock_newdir and .lock_usage (SPEC §1). They
// exist only in this process: a control file is an empty regular file,
// mode 0666, owned by its directory's owner. Opening one takes no lock;
// O_CREAT, O_TRUNC and touch succeed and change nothing. Reading returns
// the lock's status (status.go); writing keeps a short note from that open
// file description, in memory, shown beside its holder (at most
// maxNoteSize bytes, EFBIG beyond). flock(2) and fcntl(2) locks on a
// control file are the directory locks of the engine (lock.go); permission
// to take them is checked against the directory, not the file.
//
// # Locking
//
// LOCK ORDERING: Files.mu, then controlNode.mu, then
// controlHandle.mu. None is held across an engine call or a call into the
// passthrough nodes.

// maxNoteSize bounds the note one open file description may write.
const maxNoteSize = 1024

// controlNode is one control file.
type controlNode struct {
	// Dependencies
	c   *Files
	dir Dir

	// Constant data (and kind, below open: side by side they fill one
	// word, which keeps a held lock's node in the 112-byte size class)
	inode uint64

	// Mutable state
	mu sync.Mutex
	// open counts the handles of this node not yet released. GUARDED_BY(mu)
	open int32
	kind lockmgr.Kind
	// owners maps every owner that asked for this lock through one of the
	// node's handles, and has not released it through us since, to that
	// handle and the lock it asked for. It is a superset of the owners
	// that hold the lock: a Flush, Unlock or Release looks here to know
	// what to give back, and status looks here for notes. GUARDED_BY(mu)
	owners ownerRecords
}

// ownerRecord is where an owner's lock request came from.
type ownerRecord struct {
	h  *controlHandle
	id lockmgr.LockID
}

var (
	_ fusefs.Node          = (*controlNode)(nil)
	_ fusefs.NodeOpener    = (*controlNode)(nil)
	_ fusefs.NodeSetattrer = (*controlNode)(nil)
	_ fusefs.NodeFsyncer   = (*controlNode)(nil)
	_ fusefs.NodeForgetter = (*controlNode)(nil)
)

// Attr describes an empty regular file, mode 0666, owned by the directory's
// owner. Derived from the directory's attributes, it may be cached as long.
func (n *controlNode) Attr(ctx context.Context, a *fuse.Attr) error {
	var da fuse.Attr
	if err := n.dir.Attr(ctx, &da); err != nil {
		return err
	}
	*a = fuse.Attr{
		Valid: n.c.attrValid,
		Inode: n.inode,
		Size:  0,
		Nlink: 1,
		Mode:  0o666,
		Uid:   da.Uid,
		Gid:   da.Gid,
		Atime: da.Mtime,
		Mtime: da.Mtime,
		Ctime: da.Ctime,
	}
	return nil
}

// Setattr accepts what touch and open(O_TRUNC) send and changes nothing;
// it refuses chmod, chown and a truncate to any size but 0 with EPERM
// (SPEC §3).
//
// The kernel sends open(O_TRUNC) as a size change to 0 (bazil does not ask
// for atomic O_TRUNC), with the same fields as truncate(path, 0): the two
// cannot be told apart. Truncating to 0 is accepted as what it is on an
// empty file, a no-op.
func (n *controlNode) Setattr(ctx context.Context, req *fuse.SetattrRequest, resp *fuse.SetattrResponse) error {
	v := req.Valid
	if v.Mode() || v.Uid() || v.Gid() || (v.Size() && req.Size != 0) {
		return syscall.EPERM
	}
	return nil
}

// Fsync succeeds: nothing of a control file is stored.
func (n *controlNode) Fsync(ctx context.Context, req *fuse.FsyncRequest) error {
	return nil
}

// Open returns a new open file description, whatever the flags. Reads and
// writes bypass the page cache, so that the size 0 of the attributes does
// not hide the status text.
func (n *controlNode) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fusefs.Handle, error) {
	h := &controlHandle{
		n:     n,
		owner: lockmgr.Owner{Class: lockmgr.OwnerFile, ID: n.c.nextOwner.Add(1)},
	}
	n.mu.Lock()
	n.open++
	n.mu.Unlock()
	resp.Flags |= fuse.OpenDirectIO
	return h, nil
}

// Forget drops the node from the cache once the kernel has forgotten it,
// unless a handle is still open.
func (n *controlNode) Forget() {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	n.mu.Lock()
	busy := n.open > 0 || n.owners.len() > 0
	n.mu.Unlock()
	if key := (nodeKey{dir: n.dir, kind: n.kind}); !busy && n.c.nodes[key] == n {
		delete(n.c.nodes, key)
	}
}

// controlHandle is one open file description of a control file.
type controlHandle struct {
	// Dependencies
	n *controlNode

	// Constant data

	// owner is the flock owner of this open file description.
	owner lockmgr.Owner

	// Mutable state

	// owners are the owners whose record in n.owners names this handle,
	// so that Release finds them without looking at the node's other
	// owners. GUARDED_BY(n.mu)
	owners []lockmgr.Owner

	mu sync.Mutex
	// text is what was read and written through this handle; nil until
	// the first Read or Write (a handle that only locks has none, which
	// keeps it in the 64-byte size class). GUARDED_BY(mu)
	text *handleText
}

// handleText is what a control handle was read and written.
type handleText struct {
	// note is what was written through the handle.
	note []byte
	// status is the text generated by the last read at offset 0; reads at
	// later offsets continue it, so that one read loop sees one snapshot.
	status []byte
}

// textLocked returns h's text, making it on first use. Call with h.mu held.
func (h *controlHandle) textLocked() *handleText {
	if h.text == nil {
		h.text = &handleText{}
	}
	return h.text
}

var (
	_ fusefs.HandleReader   = (*controlHandle)(nil)
	_ fusefs.HandleWriter   = (*controlHandle)(nil)
	_ fusefs.HandleFlusher  = (*controlHandle)(nil)
	_ fusefs.HandleReleaser = (*controlHandle)(nil)
	_ fusefs.HandlePoller   = (*controlHandle)(nil)
)

// Poll answers ENOSYS, which makes the kernel stop sending poll requests on
// this connection: a control file is always ready, like a regular file.
// bazil's default ("ready") keeps the kernel asking at every epoll_wait of
// every program that registered the file with epoll (the Go runtime
// registers every file it opens), a round trip each time.
//
// A Go program must still not open files with os.Open on a mount that it
// serves itself: until the first answer, the kernel asks from inside
// epoll_ctl and epoll_wait, on threads that hold the runtime's Ps, and the
// server can be left without a P to answer (the tests use raw syscalls).
func (h *controlHandle) Poll(ctx context.Context, req *fuse.PollRequest, resp *fuse.PollResponse) error {
	return syscall.ENOSYS
}

// Read returns the lock's status. A read at offset 0 takes a new snapshot.
func (h *controlHandle) Read(ctx context.Context, req *fuse.ReadRequest, resp *fuse.ReadResponse) error {
	h.mu.Lock()
	text := h.textLocked().status
	h.mu.Unlock()
	if req.Offset == 0 || text == nil {
		text = h.n.statusText(h, req.Header.Uid)
		h.mu.Lock()
		h.text.status = text
		h.mu.Unlock()
	}
	if req.Offset >= int64(len(text)) {
		resp.Data = nil
		return nil
	}
	end := req.Offset + int64(req.Size)
	if end > int64(len(text)) {
		end = int64(len(text))
	}
	resp.Data = append([]byte(nil), text[req.Offset:end]...)
	return nil
}

// Write keeps data as (part of) this handle's note. The note behaves as a
// small file of this open file description's own (at most maxNoteSize
// bytes, EFBIG beyond): a write goes at the kernel's offset, which is the
// descriptor's own position, and with O_APPEND at the end of the note. (The
// kernel computes an O_APPEND offset from the size it last saw any handle
// of the file reach, which is not this note's.)
func (h *controlHandle) Write(ctx context.Context, req *fuse.WriteRequest, resp *fuse.WriteResponse) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.textLocked()
	off := req.Offset
	if req.FileFlags&fuse.OpenAppend != 0 {
		off = int64(len(t.note))
	}
	if off < 0 || off+int64(len(req.Data)) > maxNoteSize {
		return syscall.EFBIG
	}
	end := int(off) + len(req.Data)
	if end > len(t.note) {
		t.note = append(t.note, make([]byte, end-len(t.note))...)
	}
	copy(t.note[off:], req.Data)
	resp.Size = len(req.Data)
	return nil
}

// noteText returns the handle's note.
func (h *controlHandle) noteText() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.text == nil {
		return ""
	}
	return string(h.text.note)
}

// Note returns what owner's descriptor wrote to the control file of lock
// id, "" if nothing; for status output outside the mount (lockfs status).
func (c *Files) Note(id lockmgr.LockID, owner lockmgr.Owner) string {
	c.mu.Lock()
	var nodes []*controlNode
	for key, n := range c.nodes {
		if key.kind == id.Kind {
			nodes = append(nodes, n)
		}
	}
	c.mu.Unlock()
	for _, n := range nodes {
		n.mu.Lock()
		rec, ok := n.owners.get(owner)
		n.mu.Unlock()
		if ok && rec.id == id {
			return strings.TrimSuffix(rec.h.noteText(), "\n")
		}
	}
	return ""
}
