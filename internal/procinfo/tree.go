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

// Alive reports whether p still runs: /proc/PID/stat exists, shows p's start
// time, and p has not exited (stat.exited: the answer Exited gives too).
func (t *Tree) Alive(p lockmgr.ProcID) bool {
	if p.PID <= 0 {
		return false
	}
	st, err := t.readStat(p.PID)
	return err == nil && st.start == p.Start && !st.exited()
}
