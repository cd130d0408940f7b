package lockmgr

import "fmt"

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
// reads /proc (see NewProcTree); tests use a fake tree.
type ProcessTree interface {
	// Lineage returns the process that thread tid belongs to, followed by
	// its ancestors. It fails if the thread no longer exists.
	Lineage(tid int) (Lineage, error)
	// Alive reports whether the process p (pid and start time) still runs.
	Alive(p ProcID) bool
}
