package fs

import (
	"sync"

	"golang.org/x/sys/unix"
)

// Shared-memory files without passthrough.
//
// Every process that uses a shared-memory file (SQLite's "-shm") maps it
// with MAP_SHARED and stores into the mapping. Through FUSE without
// passthrough, each mount's kernel has its own cached copy of each page
// and writes a dirty page back whole. Written back as it is, a page would
// undo every change that another mount, or a program on SOURCE, made to
// other bytes of it meanwhile: two SQLite processes on two mounts touch
// different bytes of the same page (one the WAL header, one its read
// mark) under different locks.
//
// So the daemon keeps a twin of each page as the kernel holds it: the
// bytes it last read for the kernel (READ) or wrote for it (WRITE). When
// the kernel writes a page back from its cache (FUSE_WRITE_CACHE), only
// the bytes that differ from the twin, the ones stored through the
// mapping, are written to SOURCE. Bytes that nobody on this mount changed
// keep whatever SOURCE holds. As long as no two processes store into the
// same byte at the same time (SQLite's WAL-index locks guarantee it), the
// file in SOURCE is what one shared memory would hold. The lock hooks of
// cache.go push the dirty pages out before every unlock and drop them at
// every lock, so that what a lock holder reads is SOURCE.

// shmPage is the unit the kernel caches and writes back.
var shmPage = int64(unix.Getpagesize())

// shmTwin is the daemon's copy of a shared-memory file's pages as the
// kernel's cache holds them.
type shmTwin struct {
	// mu is held across the backing pread or pwrite that goes with a
	// change of pages, so that the twin and SOURCE change together (a
	// local file's few pages: it does not block for long).
	mu sync.Mutex
	// pages maps a page index to its bytes. GUARDED_BY(mu)
	pages map[int64][]byte
}

// twinOf returns n's twin, making it on first use.
func (n *File) twinOf() *shmTwin {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.twin == nil {
		n.twin = &shmTwin{pages: make(map[int64][]byte)}
	}
	return n.twin
}

// recordLocked sets the twin of the bytes at off to data; if eof, the
// kernel fills the rest of the last page with zeros, and so does the twin.
func (t *shmTwin) recordLocked(off int64, data []byte, eof bool) {
	end := off + int64(len(data))
	for p := off / shmPage; p*shmPage < end; p++ {
		page := t.pages[p]
		if page == nil {
			page = make([]byte, shmPage)
			t.pages[p] = page
		}
		start, stop := max(off, p*shmPage), min(end, (p+1)*shmPage)
		copy(page[start-p*shmPage:], data[start-off:stop-off])
	}
	if page := t.pages[end/shmPage]; eof && page != nil {
		clear(page[end%shmPage:])
	}
}

// changedRunsLocked calls fn for each maximal run of data (at off) that differs
// from the twin; bytes of a page without a twin count as changed.
func (t *shmTwin) changedRunsLocked(off int64, data []byte, fn func(off int64, run []byte) error) error {
	runStart := -1
	for i := range data {
		at := off + int64(i)
		page := t.pages[at/shmPage]
		same := page != nil && page[at%shmPage] == data[i]
		switch {
		case !same && runStart < 0:
			runStart = i
		case same && runStart >= 0:
			if err := fn(off+int64(runStart), data[runStart:i]); err != nil {
				return err
			}
			runStart = -1
		}
	}
	if runStart >= 0 {
		return fn(off+int64(runStart), data[runStart:])
	}
	return nil
}

// truncateLocked forgets the twin beyond size.
func (t *shmTwin) truncateLocked(size int64) {
	for p, page := range t.pages {
		switch {
		case p*shmPage >= size:
			delete(t.pages, p)
		case (p+1)*shmPage > size:
			clear(page[size-p*shmPage:])
		}
	}
}
