package lockmgr

import (
	"context"
	"fmt"
)

// ProcID identifies a process across pid reuse: its pid and its start time
// (in clock ticks since boot, as /proc/PID/stat field 22 gives it).
type ProcID struct {
	PID   int
	Start uint64
}

// String renders "pid" for logs.
func (p ProcID) String() string { return fmt.Sprintf("%d", p.PID) }

// Lineage is a process followed by its ancestors, nearest first, ending at
// the oldest ancestor that could be read (usually init).
type Lineage []ProcID

// Self returns the process itself, or the zero ProcID for an empty lineage.
func (l Lineage) Self() ProcID {
	if len(l) == 0 {
		return ProcID{}
	}
	return l[0]
}

// Contains reports whether p is the process or one of its ancestors.
func (l Lineage) Contains(p ProcID) bool {
	for _, q := range l {
		if q == p {
			return true
		}
	}
	return false
}

// ProcessTree answers questions about processes. The real implementation
// reads /proc (internal/procinfo.NewTree); tests use a fake tree.
type ProcessTree interface {
	// Lineage returns the process that thread tid belongs to, followed by
	// its ancestors. It fails if the thread no longer exists.
	Lineage(tid int) (Lineage, error)
	// Alive reports whether the process p (pid and start time) still runs.
	Alive(p ProcID) bool
}

// ProcessWatcher is implemented by process trees that can tell the engine
// when a process exits and who holds a descriptor (procinfo.Tree does). With a
// ProcessTree that does not implement it, the engine treats every process
// that took a hold as alive until the hold is released.
type ProcessWatcher interface {
	// WaitExit blocks until process p (pid and start time) has exited,
	// returning nil (at once if it already has), or until ctx ends,
	// returning ctx.Err().
	WaitExit(ctx context.Context, p ProcID) error
	// Descriptors returns, for each file with an inode number in inos
	// that some live process holds a descriptor of, those processes, one
	// group per open file description. A process for which known(ino,
	// pid) returns true, and that holds exactly one descriptor of that
	// file, is known to hold a description of its own: it may be reported
	// as a group of its own without comparing descriptors. It stops early
	// with ctx.Err() when ctx ends.
	Descriptors(ctx context.Context, inos []uint64, known func(ino uint64, pid int) bool) (map[uint64][][]ProcID, error)
}
