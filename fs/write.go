package fs

import (
	"context"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"
)

// Write writes at an offset (at the end, if the file was opened O_APPEND:
// the backing descriptor carries O_APPEND, so writes land at SOURCE's end
// of file even when another program appended meanwhile).
func (h *fileHandle) Write(ctx context.Context, req *fuse.WriteRequest, resp *fuse.WriteResponse) error {
	if h.of.fd < 0 {
		// A detached handle, whose writes the kernel makes itself.
		return h.detachedIO("write", func(fd int) error { return h.write(fd, req, resp) })
	}
	return h.write(h.of.fd, req, resp)
}

// write is Write with fd, h's descriptor.
func (h *fileHandle) write(fd int, req *fuse.WriteRequest, resp *fuse.WriteResponse) error {
	var pre, post inodeStat
	track := fstat(fd, &pre) == nil
	defer func() {
		if track && fstat(fd, &post) == nil {
			h.n.noteChange(&pre, &post)
		} else {
			h.n.forgetCache()
		}
	}()
	if req.Flags&fuse.WriteKillSUIDGID != 0 {
		if err := h.killSetIDFd(fd); err != nil {
			return h.n.fs.fail("write", h.n.path(), err)
		}
	}
	data := req.Data
	if req.Flags&fuse.WriteCache != 0 && track && req.Offset+int64(len(data)) > pre.Size {
		// Pages dirtied through a mapping, written back past SOURCE's
		// end of file: the file shrank elsewhere since the kernel last
		// took its size, and the kernel cannot be told a smaller one
		// (cache.go raiseSize). As on a local file system, what was
		// stored past the end of file is dropped; written, it would
		// grow the file again (TestDataOpsMatchSource).
		data = data[:max(0, min(int64(len(data)), pre.Size-req.Offset))]
	}
	var done int
	var err error
	if h.shared {
		done, err = h.writeShared(req, data)
	} else {
		done, err = pwriteAll(fd, data, req.Offset)
	}
	if err != nil {
		return h.n.fs.fail("write", h.n.path(), err)
	}
	if done == len(data) {
		done = len(req.Data) // the dropped part included
	}
	resp.Size = done
	return nil
}

// pwriteAll writes data at off, retrying short writes. An error after some
// bytes were written ends the write short, without the error.
func pwriteAll(fd int, data []byte, off int64) (int, error) {
	done := 0
	for done < len(data) {
		got, err := unix.Pwrite(fd, data[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if done > 0 {
				break
			}
			return 0, err
		}
		done += got
	}
	return done, nil
}

// writeShared writes data, req's bytes or those of them before SOURCE's
// end of file, to a shared-memory file (shm.go), and returns how many it
// wrote: a page written back from the kernel's cache writes only the bytes
// stored through a mapping.
func (h *fileHandle) writeShared(req *fuse.WriteRequest, data []byte) (int, error) {
	t := h.n.twinOf()
	t.mu.Lock()
	defer t.mu.Unlock()
	done := len(data)
	var err error
	if req.Flags&fuse.WriteCache != 0 {
		err = t.changedRunsLocked(req.Offset, data, func(off int64, run []byte) error {
			got, err := pwriteAll(h.of.fd, run, off)
			if err == nil && got < len(run) {
				err = unix.ENOSPC
			}
			return err
		})
	} else {
		done, err = pwriteAll(h.of.fd, data, req.Offset)
	}
	if err != nil {
		return 0, err
	}
	t.recordLocked(req.Offset, data[:done], false)
	return done, nil
}

// FAllocate passes fallocate(2) through. The kernel does not say whether
// the caller has CAP_FSETID here: set-id bits are cleared unless it is
// root (setid.go).
func (h *fileHandle) FAllocate(ctx context.Context, req *fuse.FAllocateRequest) error {
	defer h.n.forgetCache()
	if req.Uid != 0 {
		if err := h.killSetID("fallocate"); err != nil {
			return err
		}
	}
	err := h.useFd(false, func(fd int) error {
		return unix.Fallocate(fd, uint32(req.Mode), int64(req.Offset), int64(req.Length))
	})
	if err != nil {
		return h.n.fs.fail("fallocate", h.n.path(), err)
	}
	return nil
}

// killSetID clears h's file's set-id bits before a change by a caller
// without CAP_FSETID (setid.go), and drops the mode the kernel keeps.
func (h *fileHandle) killSetID(op string) error {
	if err := h.useFd(true, h.killSetIDFd); err != nil {
		return h.n.fs.fail(op, h.n.path(), err)
	}
	return nil
}

// killSetIDFd is killSetID with fd, a descriptor of h's file; its error
// is not logged yet.
func (h *fileHandle) killSetIDFd(fd int) error {
	changed, err := killSetID(fd)
	if changed && err == nil {
		h.n.fs.invalidateAttr(h.n)
	}
	return err
}
