package procinfo

import (
	"errors"
	"fmt"
	"os"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/lockfs/lockfs/lockmgr"
)

// This file holds the real ProcessTree, read from /proc.
//
// # Pid reuse
//
// Pids are reused quickly (pid_max is often 32768), so a pid alone names
// nothing for long. Every process is named by its pid and its start time, and
// every cached answer is checked against a fresh start time before use:
//
//   - the thread cache maps a thread id and that thread's own start time to
//     the lineage resolved for it; a hit costs one read of /proc/TID/stat.
//   - the parent cache maps a lockmgr.ProcID to the parent it had when first seen.
//     A process's original parent never changes, so it needs no check. A
//     process whose parent exits is reparented (to init or a subreaper) and
//     keeps, in our eyes, the parent it had when we first saw it.
//
// Start times have a resolution of one clock tick (10ms): a pid that is freed
// and reused by a new process within the same tick is not told apart. With
// 32768 pids that needs tens of thousands of forks in 10ms.
//
// # Races
//
// /proc is read one file at a time while processes come and go. Each link is
// checked after it is read: a thread must still have the start time it had
// before its Tgid was read, and a parent must have started no later than its
// child (a pid reused since the child's PPid was read names a younger
// process, and the child has been reparented: read its PPid again).

const (
	// defaultProcRoot is where procfs is mounted.
	defaultProcRoot = "/proc"
	// defaultProcCacheSize is the default number of entries of each cache.
	defaultProcCacheSize = 4096
	// maxLineageDepth bounds the walk up the tree. Real trees are far
	// shallower; the bound keeps a corrupt (fake) tree from looping.
	maxLineageDepth = 1024
	// parentRetries is how many times a link is re-read when the parent
	// exits while it is being read.
	parentRetries = 3
	// statBufSize holds /proc/PID/stat up to field 22 with room to spare:
	// comm is at most 64 bytes and the 19 numbers between it and the start
	// time at most 20 digits each.
	statBufSize = 1024
)

// TreeConfig configures NewTree. The zero value is the default.
type TreeConfig struct {
	// ProcRoot is where procfs is mounted; "" means "/proc". Tests point it
	// at a directory of fake PID/stat and PID/status files.
	ProcRoot string
	// CacheSize is the number of entries in each of the two caches (threads
	// to lineages, processes to parents); 0 means 4096. Each entry is small
	// (a lineage is 16 bytes per ancestor).
	CacheSize int
	// RecheckAfter is how long a cached thread is trusted without reading
	// its /proc/TID/stat again; 0 means 50ms, negative means every call.
	// Linux hands out pids in a cycle through pid_max, so a thread id is
	// reused only after pid_max (32768 and more) others were made: not
	// within milliseconds. The read costs about 8 us per lock request.
	RecheckAfter time.Duration
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c TreeConfig) withDefaults() TreeConfig {
	if c.ProcRoot == "" {
		c.ProcRoot = defaultProcRoot
	}
	if c.CacheSize == 0 {
		c.CacheSize = defaultProcCacheSize
	}
	if c.RecheckAfter == 0 {
		c.RecheckAfter = defaultRecheckAfter
	}
	return c
}

// defaultRecheckAfter is TreeConfig.RecheckAfter's default.
const defaultRecheckAfter = 50 * time.Millisecond

// Validate reports a configuration that cannot work.
func (c TreeConfig) Validate() error {
	if c.CacheSize < 0 {
		return fmt.Errorf("proc tree: cache size %d is negative", c.CacheSize)
	}
	return nil
}

// Tree is the ProcessTree of the running system, read from procfs and
// cached (see the notes on pid reuse above). It is safe for concurrent use.
type Tree struct {
	// Constant data
	root         string
	recheckAfter time.Duration

	// Mutable state: the caches lock themselves.
	threads *lru.Cache[int, threadEntry]               // thread id -> its start time and lineage
	parents *lru.Cache[lockmgr.ProcID, lockmgr.ProcID] // process -> parent when first seen; zero if none
}

var _ lockmgr.ProcessTree = (*Tree)(nil)

// threadEntry is the thread cache's value: valid while the thread id still
// has start time start.
type threadEntry struct {
	start   uint64
	lineage lockmgr.Lineage // INVARIANT: len == cap, never modified after caching
	checked time.Time       // when start was last read from /proc (monotonic)
}

var (
	// errGone reports that a process or thread exited while it was read.
	errGone = fmt.Errorf("process exited: %w", os.ErrNotExist)
	// errParentUnknown reports that a process's parent kept exiting while
	// it was read, so the walk cannot go further up.
	errParentUnknown = errors.New("parent kept exiting")
)

// NewTree returns a Tree reading cfg.ProcRoot. It fails if the
// configuration is invalid or ProcRoot is not a directory.
func NewTree(cfg TreeConfig) (*Tree, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	fi, err := os.Stat(cfg.ProcRoot)
	if err != nil {
		return nil, fmt.Errorf("proc tree: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("proc tree: %s is not a directory", cfg.ProcRoot)
	}
	threads, err := lru.New[int, threadEntry](cfg.CacheSize)
	if err != nil {
		return nil, fmt.Errorf("proc tree: %w", err)
	}
	parents, err := lru.New[lockmgr.ProcID, lockmgr.ProcID](cfg.CacheSize)
	if err != nil {
		return nil, fmt.Errorf("proc tree: %w", err)
	}
	return &Tree{root: cfg.ProcRoot, recheckAfter: cfg.RecheckAfter, threads: threads, parents: parents}, nil
}

// Lineage returns the process that thread tid belongs to, then its parent,
// grandparent... as they were when each was first seen. It ends at pid 1, at
// a process with no parent in our pid namespace, or, if an ancestor exits
// during the walk, at the oldest ancestor that could be read. The result is
// shared with the cache: callers must not modify it (appending is safe). A
// thread that does not exist yields an error wrapping os.ErrNotExist.
func (t *Tree) Lineage(tid int) (lockmgr.Lineage, error) {
	l, err := t.lineage(tid)
	if err != nil {
		return nil, fmt.Errorf("lineage of thread %d: %w", tid, err)
	}
	return l, nil
}

// lineage is Lineage without the error context.
func (t *Tree) lineage(tid int) (lockmgr.Lineage, error) {
	if tid <= 0 {
		return nil, fmt.Errorf("no such thread: %w", os.ErrNotExist)
	}
	e, cached := t.threads.Get(tid)
	if cached && t.recheckAfter > 0 && time.Since(e.checked) < t.recheckAfter {
		return e.lineage, nil
	}
	st, err := t.readStat(tid)
	if err != nil {
		return nil, err
	}
	tstart := st.start
	if cached && e.start == tstart {
		e.checked = time.Now()
		t.threads.Add(tid, e)
		return e.lineage, nil
	}

	// Miss, or tid now names another thread: resolve it afresh.
	self, err := t.process(tid, tstart)
	if err != nil {
		return nil, err
	}
	l, complete, err := t.walk(self)
	if err != nil {
		return nil, err
	}
	l = l[:len(l):len(l)]
	if complete {
		t.threads.Add(tid, threadEntry{start: tstart, lineage: l, checked: time.Now()})
	}
	return l, nil
}

// process returns the process that thread tid (started at tstart) belongs to.
func (t *Tree) process(tid int, tstart uint64) (lockmgr.ProcID, error) {
	tgid, _, err := t.readStatus(tid)
	if err != nil {
		return lockmgr.ProcID{}, err
	}
	if tgid == tid {
		return lockmgr.ProcID{PID: tid, Start: tstart}, nil
	}
	pst, err := t.readStat(tgid)
	if err != nil {
		return lockmgr.ProcID{}, err
	}
	pstart := pst.start
	// The thread group lives, and its tgid cannot be reused, as long as one
	// of its threads does: if tid is still the thread we started with, tgid
	// and pstart belong to its process.
	if again, err := t.readStat(tid); err != nil {
		return lockmgr.ProcID{}, err
	} else if again.start != tstart || pstart > tstart {
		return lockmgr.ProcID{}, errGone
	}
	return lockmgr.ProcID{PID: tgid, Start: pstart}, nil
}

// walk returns self and its ancestors. complete is false if the walk stopped
// early because an ancestor exited before its parent could be read.
func (t *Tree) walk(self lockmgr.ProcID) (l lockmgr.Lineage, complete bool, err error) {
	l = lockmgr.Lineage{self}
	for p := self; p.PID != 1; {
		if len(l) >= maxLineageDepth {
			return nil, false, fmt.Errorf("lineage deeper than %d processes", maxLineageDepth)
		}
		parent, err := t.parent(p)
		if errors.Is(err, errParentUnknown) || (errors.Is(err, os.ErrNotExist) && p != self) {
			return l, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		if parent.PID == 0 {
			break
		}
		l = append(l, parent)
		p = parent
	}
	return l, true, nil
}

// parent returns the parent p had when first seen, or the zero lockmgr.ProcID if p
// has none (init, kernel threads, a process whose parent is outside our pid
// namespace). It fails with an error wrapping os.ErrNotExist if p has exited,
// and with errParentUnknown if its parent kept exiting while being read.
func (t *Tree) parent(p lockmgr.ProcID) (lockmgr.ProcID, error) {
	if q, ok := t.parents.Get(p); ok {
		return q, nil
	}
	for range parentRetries {
		_, ppid, err := t.readStatus(p.PID)
		if err != nil {
			return lockmgr.ProcID{}, err
		}
		q := lockmgr.ProcID{PID: ppid}
		if ppid != 0 {
			var pst stat
			pst, err = t.readStat(ppid)
			q.Start = pst.start
			if errors.Is(err, os.ErrNotExist) {
				continue // the parent exited: p has been reparented
			}
			if err != nil {
				return lockmgr.ProcID{}, err
			}
		}
		// p must not have exited (and its pid been reused) since its PPid
		// was read.
		if st, err := t.readStat(p.PID); err != nil {
			return lockmgr.ProcID{}, err
		} else if st.start != p.Start {
			return lockmgr.ProcID{}, errGone
		}
		if q.Start > p.Start {
			continue // ppid was reused by a younger process: p has been reparented
		}
		// Keep the first parent recorded if another goroutine raced us.
		if prev, ok, _ := t.parents.PeekOrAdd(p, q); ok {
			return prev, nil
		}
		return q, nil
	}
	return lockmgr.ProcID{}, errParentUnknown
}

// Alive reports whether p still runs: /proc/PID/stat exists, shows p's start
// time, and p has not exited (stat.exited: the answer Exited gives too).
func (t *Tree) Alive(p lockmgr.ProcID) bool {
	if p.PID <= 0 {
		return false
	}
	st, err := t.readStat(p.PID)
	return err == nil && st.start == p.Start && !st.exited()
}
