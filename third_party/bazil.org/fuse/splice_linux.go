package fuse

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A read answered by splice(2) goes from the file's page cache into the
// reply without passing through the daemon's memory: the reply header is
// written into a pipe, the file's pages are spliced after it (the pipe
// takes references to them, no copy), and the pipe is spliced into
// /dev/fuse, where the kernel copies each page once into the reader's
// page cache. Through Data, the same read copies every byte twice: from
// the file into the buffer (pread), and from the buffer into the reply.
//
// A pipe holds a fixed number of buffers (slots), one page each at most
// here: the header takes one, and every page of file data one more. A
// pipe grows to at most /proc/sys/fs/pipe-max-size bytes (1 MiB by
// default) without CAP_SYS_RESOURCE, 256 slots, so a read that spans
// more than 255 pages is answered through Data (SpliceReadMax).

// maxFreePipes bounds the pipes kept for reuse: one per reader that
// answers a read at the same time.
const maxFreePipes = 8

// wantPipeSize is the pipe size asked for: one slot for the header and
// 256 for the largest read (1 MiB); the kernel rounds it to a power of
// two pages, and refuses more than pipe-max-size.
const wantPipeSize = 2 << 20

// SpliceReadMax returns the largest read, in bytes, that a pipe can carry
// with its header on this system: 255 pages with the default
// pipe-max-size (1 MiB), so that a mount's max_read can keep the kernel's
// reads within it. It returns 0 if pipe-max-size cannot be read.
func SpliceReadMax() int {
	b, err := os.ReadFile("/proc/sys/fs/pipe-max-size")
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	page := os.Getpagesize()
	slots := min(n, wantPipeSize) / page
	if slots < 2 {
		return 0
	}
	return min((slots-1)*page, maxWrite)
}

// splicePipe is a pipe sized for splice replies.
type splicePipe struct {
	r, w  int
	slots int
}

func (p *splicePipe) close() {
	unix.Close(p.r)
	unix.Close(p.w)
}

// pipePool keeps empty pipes for reuse.
type pipePool struct {
	mu     sync.Mutex
	free   []*splicePipe // GUARDED_BY(mu)
	closed bool          // GUARDED_BY(mu)
	// grown is the size the kernel last let a new pipe grow to, asked
	// for first by the next one (0: none grew yet). A pipe is closed
	// after every short read, at each file's end, so new ones are
	// common. GUARDED_BY(mu)
	grown int
}

// get returns an empty pipe, a new one if none is free.
func (pp *pipePool) get() (*splicePipe, error) {
	pp.mu.Lock()
	if n := len(pp.free); n > 0 {
		p := pp.free[n-1]
		pp.free = pp.free[:n-1]
		pp.mu.Unlock()
		return p, nil
	}
	grown := pp.grown
	pp.mu.Unlock()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, err
	}
	p := &splicePipe{r: fds[0], w: fds[1]}
	size, err := growPipe(p.w, grown)
	if err == nil {
		pp.mu.Lock()
		pp.grown = size
		pp.mu.Unlock()
	} else {
		// A pipe that cannot grow keeps its 16 slots and still
		// answers reads of up to 15 pages.
		size, err = unix.FcntlInt(uintptr(p.w), unix.F_GETPIPE_SZ, 0)
	}
	if err != nil {
		p.close()
		return nil, err
	}
	p.slots = size / os.Getpagesize()
	return p, nil
}

// growPipe grows the pipe whose write end is fd for splice replies and
// returns its new size: to grown if that is set (the size an earlier
// pipe got), else to wantPipeSize, or to what pipe-max-size allows.
func growPipe(fd, grown int) (int, error) {
	if grown > 0 {
		if size, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, grown); err == nil {
			return size, nil
		}
	}
	if size, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, wantPipeSize); err == nil {
		return size, nil
	}
	return unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, min(SpliceReadMax()+os.Getpagesize(), wantPipeSize))
}

// put keeps an empty pipe for reuse, or closes it.
func (pp *pipePool) put(p *splicePipe) {
	pp.mu.Lock()
	if !pp.closed && len(pp.free) < maxFreePipes {
		pp.free = append(pp.free, p)
		p = nil
	}
	pp.mu.Unlock()
	if p != nil {
		p.close()
	}
}

// closeAll closes the free pipes; pipes put back later are closed.
func (pp *pipePool) closeAll() {
	pp.mu.Lock()
	free := pp.free
	pp.free, pp.closed = nil, true
	pp.mu.Unlock()
	for _, p := range free {
		p.close()
	}
}

// spliceReply answers request unique with size bytes of fd at off through a
// pipe. It returns false, having answered nothing, if that could not be
// done: the file gave fewer bytes (its end, or a truncate meanwhile), the
// data span more pages than the pipe has slots, no pipe could be made, or
// the kernel refused the spliced reply. The caller then answers through
// Data; if the kernel had taken the request already, that answer fails
// as a second one would (ENOENT).
func (c *Conn) spliceReply(unique uint64, off int64, fd int, size int) bool {
	p, err := c.pipes.get()
	if err != nil {
		return false
	}
	page := int64(os.Getpagesize())
	pages := int((off%page + int64(size) + page - 1) / page)
	if 1+pages > p.slots {
		c.pipes.put(p)
		return false
	}
	var hdr outHeader
	hdr.Unique = unique
	hdr.Len = uint32(unsafe.Sizeof(hdr)) + uint32(size)
	hb := unsafe.Slice((*byte)(unsafe.Pointer(&hdr)), unsafe.Sizeof(hdr))
	if n, err := unix.Write(p.w, hb); err != nil || n != len(hb) {
		p.close()
		return false
	}
	got := 0
	for got < size {
		// SPLICE_F_NONBLOCK: a full pipe ends the splice short
		// instead of blocking the reader for good.
		n, err := unix.Splice(fd, &off, p.w, nil, size-got, unix.SPLICE_F_NONBLOCK)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			break
		}
		got += int(n)
	}
	if got != size {
		p.close()
		return false
	}
	// No SPLICE_F_MOVE: with it, the kernel may steal the file's pages
	// for the mount's page cache (fuse_try_move_folio), which removes
	// them from SOURCE's, and SEEK_DATA on SOURCE then reports a
	// preallocated range that was read through the mount as a hole.
	// Counted before the reply goes out: the reader may run, and look,
	// as soon as the kernel has it.
	c.spliced.Add(1)
	c.wio.RLock()
	n, err := unix.Splice(p.r, nil, c.fd(), nil, int(hdr.Len), 0)
	c.wio.RUnlock()
	if err != nil || n != int64(hdr.Len) {
		c.spliced.Add(^uint64(0))
		p.close()
		return false
	}
	c.pipes.put(p)
	return true
}
