package control

import (
	"testing"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestNodeAndHandleSize keeps a control file's node in the 112-byte size
// class and a handle that only locks in the 64-byte one: a daemon has one
// of each per held lock (docs/BENCHMARKS.md "Held locks"). A field added to
// either must find room in its padding, go to handleText (a handle's), or
// say in BENCHMARKS what it costs.
func TestNodeAndHandleSize(t *testing.T) {
	testutil.SizeAtMost[controlNode](t, 112)
	testutil.SizeAtMost[controlHandle](t, 64)
}
