package fs

import (
	"context"
	"encoding/binary"
	"sync"
	"syscall"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/fs/control"
	"github.com/lockfs/lockfs/internal/resolve"
)

// Dir is a directory of SOURCE.
type Dir struct {
	node
}

var (
	_ fusefs.Node                = (*Dir)(nil)
	_ fusefs.NodeGetattrer       = (*Dir)(nil)
	_ fusefs.NodeSetattrer       = (*Dir)(nil)
	_ fusefs.NodeRequestLookuper = (*Dir)(nil)
	_ fusefs.NodeOpener          = (*Dir)(nil)
	_ fusefs.NodeCreater         = (*Dir)(nil)
	_ fusefs.NodeMkdirer         = (*Dir)(nil)
	_ fusefs.NodeMknoder         = (*Dir)(nil)
	_ fusefs.NodeSymlinker       = (*Dir)(nil)
	_ fusefs.NodeLinker          = (*Dir)(nil)
	_ fusefs.NodeRemover         = (*Dir)(nil)
	_ fusefs.NodeRenamer         = (*Dir)(nil)
	_ fusefs.NodeFsyncer         = (*Dir)(nil)
	_ fusefs.NodeForgetter       = (*Dir)(nil)
	_ fusefs.NodeGetxattrer      = (*Dir)(nil)
	_ fusefs.NodeListxattrer     = (*Dir)(nil)
	_ fusefs.NodeSetxattrer      = (*Dir)(nil)
	_ fusefs.NodeRemovexattrer   = (*Dir)(nil)
)

// childPath is the path of name in d, for logs.
func (d *Dir) childPath(name string) string {
	return joinRel(d.relPath(), name)
}

// at calls fn with an O_PATH descriptor of d and d's attributes, for an
// operation on a name in d. The root's is rootFd itself: it names SOURCE's
// top directory for the mount's life, so opening "." beneath it again (an
// openat2 and a close per lookup, create or removal in the top directory)
// would find the same inode.
func (d *Dir) at(fn func(dirFd int, dirSt *inodeStat) error) error {
	var st inodeStat
	if d == d.fs.root {
		if err := fstat(d.fs.rootFd, &st); err != nil {
			return err
		}
		return fn(d.fs.rootFd, &st)
	}
	name, top := d.topName()
	if !top {
		d.dropPin()
	} else if of := d.borrowPin(name, &st); of != nil {
		defer d.returnOpen(of)
		return fn(of.fd, &st)
	}
	fd, err := d.openByName(unix.O_PATH|unix.O_DIRECTORY, &st)
	if err != nil {
		return err
	}
	if top {
		if of := d.keepPin(fd); of != nil {
			defer d.returnOpen(of)
			return fn(fd, &st)
		}
	}
	defer closeFd(fd)
	return fn(fd, &st)
}

// Lookup finds name in d. The control names are the control files; the
// backing names do not exist.
func (d *Dir) Lookup(ctx context.Context, req *fuse.LookupRequest, resp *fuse.LookupResponse) (fusefs.Node, error) {
	return d.lookup(ctx, req.Name, -1, resp)
}

// lookup is Lookup of name, read in dirFd, a descriptor of d, or with
// dirFd -1 in d opened by name.
func (d *Dir) lookup(ctx context.Context, name string, dirFd int, resp *fuse.LookupResponse) (fusefs.Node, error) {
	if kind, ok := controlKind(name); ok {
		resp.EntryValid = entryValid
		return d.fs.controlNode(d, kind), nil
	}
	if d.fs.isBacking(name) {
		return nil, syscall.ENOENT
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	var st inodeStat
	var err error
	if dirFd >= 0 {
		err = lstatAt(dirFd, name, &st)
	} else {
		err = d.at(func(fd int, _ *inodeStat) error {
			return lstatAt(fd, name, &st)
		})
	}
	if err != nil {
		return nil, d.fs.fail("lookup", d.childPath(name), err)
	}
	resp.EntryValid = entryValid
	n := d.fs.nodeFor(&st, d, name)
	setEntryAttr(ctx, n, &st)
	return n, nil
}

// Open opens the directory for reading its entries.
func (d *Dir) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fusefs.Handle, error) {
	if err := d.fs.takeHandle("opendir", d.path, req.Uid); err != nil {
		return nil, err
	}
	var st inodeStat
	fd, err := d.openByName(unix.O_RDONLY|unix.O_DIRECTORY, &st)
	if err != nil {
		// Removed, but still open elsewhere: a new open file description
		// of the same directory (its own offset).
		of := d.borrowOpen(false)
		if of == nil {
			d.fs.handles.give(req.Uid)
			return nil, d.fs.fail("opendir", d.path(), err)
		}
		fd, err = resolve.Reopen(of.fd, unix.O_RDONLY|unix.O_DIRECTORY)
		d.returnOpen(of)
		if err != nil {
			d.fs.handles.give(req.Uid)
			return nil, d.fs.fail("opendir", d.path(), err)
		}
	}
	h := &dirHandle{d: d, of: &openFile{fd: fd, uid: req.Uid}}
	d.addOpen(h.of)
	if d.fs.cfg.ReadDirPlus {
		return dirPlusHandle{h}, nil
	}
	return h, nil
}

// dirHandle is an open directory.
type dirHandle struct {
	// Dependencies
	d *Dir

	// Constant data
	of *openFile

	// Mutable state
	// mu serializes reads of the directory descriptor's offset.
	mu sync.Mutex
}

var (
	_ fusefs.HandleReadDirAller = (*dirHandle)(nil)
	_ fusefs.HandleReleaser     = (*dirHandle)(nil)
)

// ReadDirAll lists the directory from its start: the backing entries but
// the reserved names, then, with Config.ListControlFiles, the three control
// files. By default they are found by name only (SPEC §1), so that tools
// that walk trees (rm -rf, cp -a, tar, find) do not meet them.
func (h *dirHandle) ReadDirAll(ctx context.Context) ([]fuse.Dirent, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := unix.Seek(h.of.fd, 0, 0); err != nil {
		return nil, h.d.fs.fail("readdir", h.d.path(), err)
	}
	var out []fuse.Dirent
	f := h.d.fs
	err := getdents(h.of.fd, 32<<10, func(buf []byte) { out = f.appendDirents(out, buf) })
	if err != nil {
		return nil, f.fail("readdir", h.d.path(), err)
	}
	if !f.cfg.ListControlFiles {
		return out, nil
	}
	// The control files, with the inode numbers their nodes report
	// (control.Inode), so that readdir and stat agree.
	for _, name := range []string{".lock", ".lock_newdir", ".lock_usage"} {
		kind, _ := controlKind(name)
		out = append(out, fuse.Dirent{Name: name, Type: fuse.DT_File, Inode: control.Inode(h.d, kind)})
	}
	return out, nil
}

// dirPlusHandle is an open directory that answers READDIRPLUS
// (Config.ReadDirPlus): each entry of a listing carries what a lookup of
// its name would answer, so that a walk that stats what it lists (ls -l,
// du, tar, rsync) costs no LOOKUP per name. bazil registers the node each
// entry returns as it registers a Lookup's, one kernel reference per
// entry sent, and the kernel gives them back with FORGET as for lookups.
type dirPlusHandle struct {
	*dirHandle
}

var _ fusefs.HandleReadDirPlusAller = dirPlusHandle{}

// LookupDirent looks ent up as Lookup would (control files included, with
// Config.ListControlFiles), in the directory the handle has open and
// listed: one statx per entry, the node from the node table (a hard link
// is the node its other names have).
func (h dirPlusHandle) LookupDirent(ctx context.Context, ent fuse.Dirent, resp *fuse.LookupResponse) (fusefs.Node, error) {
	return h.d.lookup(ctx, ent.Name, h.of.fd, resp)
}

// getdents calls fn with each batch of linux_dirent64 records of the
// directory open at fd, from its offset to its end, read bufSize bytes at
// a time.
func getdents(fd, bufSize int, fn func(buf []byte)) error {
	buf := make([]byte, bufSize)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return nil
		}
		fn(buf[:n])
	}
}

// appendDirents parses linux_dirent64 records, leaving out reserved names.
func (f *FS) appendDirents(out []fuse.Dirent, buf []byte) []fuse.Dirent {
	for len(buf) >= 19 {
		ino := binary.NativeEndian.Uint64(buf[0:8])
		reclen := int(binary.NativeEndian.Uint16(buf[16:18]))
		typ := buf[18]
		if reclen < 19 || reclen > len(buf) {
			break
		}
		nameb := buf[19:reclen]
		for i, c := range nameb {
			if c == 0 {
				nameb = nameb[:i]
				break
			}
		}
		name := string(nameb)
		buf = buf[reclen:]
		if f.isReserved(name) {
			continue
		}
		out = append(out, fuse.Dirent{Inode: ino, Type: fuse.DirentType(typ), Name: name})
	}
	return out
}

// Release closes the directory.
func (h *dirHandle) Release(ctx context.Context, req *fuse.ReleaseRequest) error {
	h.d.releaseOpen(h.of)
	return nil
}
