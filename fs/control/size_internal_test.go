package control

import (
	"testing"
	"unsafe"
)

// TestNodeAndHandleSize keeps a control file's node in the 112-byte size
// class and a handle that only locks in the 64-byte one: a daemon has one
// of each per held lock (docs/BENCHMARKS.md "Held locks"). A field added to
// either must find room in its padding, go to handleText (a handle's), or
// say in BENCHMARKS what it costs.
func TestNodeAndHandleSize(t *testing.T) {
	if n := unsafe.Sizeof(controlNode{}); n > 112 {
		t.Errorf("controlNode is %d bytes, more than the 112 of its size class", n)
	}
	if n := unsafe.Sizeof(controlHandle{}); n > 64 {
		t.Errorf("controlHandle is %d bytes, more than the 64 of its size class", n)
	}
}
