package fs

import (
	"errors"
	"strings"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/resolve"
)

// The kernel's page cache of regular files, when reads and writes reach
// the daemon (no FUSE passthrough). See docs/DATA-PATH.md for the
// guarantee as users see it.
//
// Writes are written through (no writeback cache), so the backing file
// always holds what was written through this mount; what can go stale is
// the kernel's copy of a file that changed in SOURCE directly or through
// another mount. The daemon keeps, per node, the version of the backing
// file (inode, size, mtime, ctime: fileVersion) that the kernel's cached
// pages are known to be no older than:
//
//   - open: if the backing file still has that version, the open keeps the
//     cache (FOPEN_KEEP_CACHE); otherwise the kernel drops it. Either way
//     the version becomes the file's current one.
//   - lock grant (flock, fcntl, OFD, on any range): the same check, and a
//     changed file has its cached pages and attributes invalidated before
//     the lock is answered, so the locker reads what the previous holder
//     wrote, wherever it wrote it (as NFS does).
//   - attributes: the kernel may keep a file's attributes fileAttrValid.
//     The daemon remembers the version it last gave (attrVer); an open or
//     a lock grant that finds the file at another version invalidates
//     them, so that the size the kernel reads up to is the file's, and
//     raises the kernel's size where it may be below the file's
//     (raiseSize: mappings and splice use the size without asking).
//   - pages dirtied through a mapping and written back past SOURCE's end
//     of file (it shrank elsewhere) write only what is before the end
//     (file.go Write).
//   - writes, truncates and fallocates through this mount change the
//     backing file and the kernel's cache alike: the daemon takes the
//     backing file's version before and after, and if the version before
//     was the known one, the one after becomes known (the change was only
//     ours); otherwise the cache is unknown and the next check drops it.
//
// Shared-memory files (a name ending in "-shm", SQLite's WAL index) are
// mapped with MAP_SHARED by every process that uses them, and a store
// into such a mapping reaches neither the daemon nor another mount's
// cache. They are never kept across opens, and every lock or unlock
// request on one invalidates its cached pages whatever its version: the
// kernel first writes the pages dirtied through mappings back through the
// daemon (to SOURCE), then drops them, so that the next access reads
// SOURCE. A lock request on NAME-shm also revalidates NAME and NAME-wal,
// the files whose consistency the WAL index's locks guard (SQLite takes
// no lock on them while in WAL mode). A lock granted on NAME drops the
// kernel's names NAME-journal and NAME-wal (invalidateJournalEntries).

// With FUSE passthrough none of this is needed for the data (reads,
// writes and mmap go to the backing file's own page cache), and an open
// that carries FOPEN_PASSTHROUGH must not carry FOPEN_KEEP_CACHE: the
// kernel fails such an open with EIO. openCache's answer is for opens the
// daemon serves.

// fileVersion is what tells a changed backing file from an unchanged one.
type fileVersion struct {
	ino          uint64
	size         int64
	mtime, ctime unix.Timespec
}

// versionOf returns the version of the file st describes.
func versionOf(st *inodeStat) fileVersion {
	return fileVersion{ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// sharedMemorySuffix marks a shared-memory file (SQLite's "-shm").
const sharedMemorySuffix = "-shm"

// isSharedMemory reports whether n is a shared-memory file, by its newest name.
func (n *File) isSharedMemory() bool {
	n.fs.treeMu.RLock()
	defer n.fs.treeMu.RUnlock()
	return len(n.links) > 0 && strings.HasSuffix(n.links[0].name, sharedMemorySuffix)
}

// openCache records the version of the file just opened (st) and reports
// whether the open may keep the kernel's cached pages, and whether the
// kernel's size may be below the file's (grown: see openGrown).
func (n *File) openCache(st *inodeStat, shared bool) (keep, grown bool) {
	if n.fs.cfg.KeepCacheUnsafe {
		return true, false
	}
	v := versionOf(st)
	n.mu.Lock()
	known := n.cacheKnown
	keep = known && n.cacheVer == v && !shared
	staleAttr := n.attrVer != v
	// The file is larger than the kernel was last told, or its size
	// changed since the version the daemon knew (a read that came back
	// short in between may have lowered the kernel's size).
	grown = !keep && !shared && (st.Size > n.attrVer.size || known && n.cacheVer.size != st.Size)
	n.cacheVer, n.cacheKnown = v, true
	n.mu.Unlock()
	if staleAttr && !grown {
		// The kernel's size and times are older than the file: it would
		// read only up to the old size until they expire. (openGrown
		// drops them for a grown file.)
		n.fs.invalidateAttr(n)
	}
	return keep, grown
}

// openGrown follows an open of h (whose file had the attributes st) that
// openCache found grown, instead of openCache's invalidation of the
// attributes: an open that is not a passthrough one raises the kernel's
// size. The kernel drops the cached pages itself after the open's
// answer; dropped before, none dirtied through a mapping is left for
// raiseSize's store to overwrite.
func (h *fileHandle) openGrown(st *inodeStat) {
	if h.io == ioPassthrough {
		// Reads, writes and mappings use SOURCE's own size; stat uses
		// the attributes, dropped here.
		h.n.fs.invalidateAttr(h.n)
		return
	}
	h.n.fs.invalidateData(h.n) // attributes included
	h.n.raiseSize(h.of.fd, st.Size)
}

// raiseSize makes the kernel's size of n at least size, that of the
// backing file (fd) after a change made elsewhere, which may be larger
// than the kernel's, while n's cached pages have just been dropped. The
// dropped attributes are fetched again when the kernel stats the file or
// reads past its old size, but the page faults of a mapping, splice(2)
// and the write-back of pages dirtied through a mapping use the size the
// kernel has: a mapping of the new bytes would fault with SIGBUS, a
// sendfile(2) would stop at the old end, and a store past it would be
// dropped at write-back (TestDataOpsMatchSource). FUSE_NOTIFY_STORE of the
// file's last byte, as SOURCE has it, raises the kernel's size to the end
// of what it stores; NFS gets the same from the GETATTR of its open and
// lock. No notification lowers the kernel's size (docs/FUSE-NOTES.md):
// for a file that shrank, Write drops what is written back past the end.
func (n *File) raiseSize(fd int, size int64) {
	srv := n.fs.server.Load()
	if srv == nil || size <= 0 {
		return
	}
	// A descriptor of its own, so that this read, which no program
	// made, leaves the file's access time alone (O_NOATIME: the file's
	// owner or CAP_FOWNER), and reads a file opened write-only too.
	var b [1]byte
	rfd, err := resolve.Reopen(fd, unix.O_RDONLY|unix.O_NOATIME)
	k := 0
	if err == nil {
		k, err = unix.Pread(rfd, b[:], size-1)
		closeFd(rfd)
	}
	if err != nil || k != 1 {
		// Not ours to read without touching it, or shorter again by
		// now: the kernel keeps its size until it stats the file.
		n.fs.log.WithError(err).WithField("path", n.path()).Debug("not raising the kernel's size of a grown file")
		return
	}
	if err := srv.NotifyStore(n, uint64(size-1), b[:]); err != nil && !errors.Is(err, fuse.ErrNotCached) {
		n.fs.log.WithError(err).Warn("raising the kernel's size of a file")
	}
}

// noteGiven records that the kernel is given n's attributes st (and
// maybe a name for n), and, for a regular file (file), their version.
func (n *node) noteGiven(st *inodeStat, file bool) {
	gen := n.fs.given.Add(1)
	n.mu.Lock()
	n.givenGen = gen
	if f, ok := n.self.(*File); ok && file {
		f.attrVer = versionOf(st)
	}
	n.mu.Unlock()
}

// noteChange records a change the daemon made to n's backing file, which
// had version pre before and post after it.
func (n *node) noteChange(pre, post *inodeStat) {
	f, ok := n.self.(*File)
	if !ok {
		return // a directory: no cached pages
	}
	f.mu.Lock()
	if f.cacheKnown && f.cacheVer == versionOf(pre) {
		f.cacheVer = versionOf(post)
	} else {
		f.cacheKnown = false
	}
	f.mu.Unlock()
}

// forgetCache records a change the daemon made to n's backing file whose
// versions it could not take: the next check drops the kernel's cache.
func (n *node) forgetCache() {
	f, ok := n.self.(*File)
	if !ok {
		return // a directory: no cached pages
	}
	f.mu.Lock()
	f.cacheKnown = false
	f.mu.Unlock()
}

// revalidate drops the kernel's cache of n if the backing file (st, of
// the descriptor fd) is not at the known version, or always if force (a
// shared-memory file), and then raises the kernel's size unless fd is -1;
// the version becomes st's.
func (n *File) revalidate(fd int, st *inodeStat, force bool) {
	v := versionOf(st)
	n.mu.Lock()
	stale := force || !n.cacheKnown || n.cacheVer != v
	n.cacheVer, n.cacheKnown = v, true
	staleAttr := n.attrVer != v
	n.mu.Unlock()
	switch {
	case stale:
		n.fs.invalidateData(n) // attributes included
		if !force && fd >= 0 {
			// Whatever the kernel was told: a read that came back
			// short may have lowered its size since.
			n.raiseSize(fd, st.Size)
		}
	case staleAttr:
		n.fs.invalidateAttr(n)
	}
}

// lockCache revalidates the kernel's cache of h's file for a lock request
// that was granted, or an unlock about to be made: see the top of the file.
func (h *fileHandle) lockCache(unlock bool) {
	n := h.n
	if n.fs.cfg.KeepCacheUnsafe {
		return
	}
	shared := h.shared
	if unlock && !shared {
		return // writes went through already
	}
	var st inodeStat
	if err := h.useFd(true, func(fd int) error { return fstat(fd, &st) }); err != nil {
		n.fs.invalidateData(n)
		return
	}
	fd := h.of.fd
	if h.io == ioPassthrough {
		fd = -1 // no size to raise: see openGrown
	}
	n.revalidate(fd, &st, shared)
	if shared {
		n.revalidateSiblings()
	} else if !unlock {
		n.invalidateJournalEntries()
	}
}

// journalSuffixes name the files a lock on NAME guards in SQLite's
// protocol: created and removed by the holder of NAME's locks.
var journalSuffixes = []string{"-journal", "-wal"}

// invalidateJournalEntries drops the kernel's names NAME-journal and
// NAME-wal beside n (NAME), so that the lock holder's next look at them
// asks SOURCE: the kernel keeps a name for entryValid, and a journal
// removed by the previous holder on another mount would otherwise still
// seem to exist (SQLite would take it for a hot journal and fail to open
// it).
func (n *File) invalidateJournalEntries() {
	srv := n.fs.server.Load()
	if srv == nil {
		return
	}
	n.fs.treeMu.RLock()
	if len(n.links) == 0 {
		n.fs.treeMu.RUnlock()
		return
	}
	l := n.links[0]
	n.fs.treeMu.RUnlock()
	for _, s := range journalSuffixes {
		if err := srv.InvalidateEntry(l.dir, l.name+s); err != nil && !errors.Is(err, fuse.ErrNotCached) {
			n.fs.log.WithError(err).Warn("invalidating the kernel's name of a journal")
		}
	}
}

// revalidateSiblings revalidates NAME and NAME-wal for n, NAME-shm: the
// nodes of those names that the kernel knows, if any.
func (n *File) revalidateSiblings() {
	n.fs.treeMu.RLock()
	if len(n.links) == 0 {
		n.fs.treeMu.RUnlock()
		return
	}
	l := n.links[0]
	n.fs.treeMu.RUnlock()
	base := strings.TrimSuffix(l.name, sharedMemorySuffix)
	for _, name := range []string{base, base + "-wal"} {
		var st inodeStat
		err := l.dir.at(func(dirFd int, _ *inodeStat) error { return lstatAt(dirFd, name, &st) })
		if err != nil {
			continue
		}
		n.fs.nodesMu.Lock()
		sib, _ := n.fs.nodes[keyOf(&st)].(*File)
		n.fs.nodesMu.Unlock()
		if sib != nil {
			sib.revalidate(-1, &st, false)
		}
	}
}
