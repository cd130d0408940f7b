package lockmgr

import (
	"testing"
	"unsafe"
)

// TestHoldSize keeps a hold in the 208-byte size class: a host has one
// per held lock and one more on each of its ancestors for the lock's owner
// (docs/BENCHMARKS.md "Held locks"). A field added to hold must find room
// in its padding, or say in BENCHMARKS what it costs.
func TestHoldSize(t *testing.T) {
	if n := unsafe.Sizeof(hold{}); n > 208 {
		t.Fatalf("hold is %d bytes, more than the 208 of its size class", n)
	}
}
