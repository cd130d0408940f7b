package testutil

import (
	"testing"
	"unsafe"
)

// SizeAtMost fails t (Errorf) if a T takes more than max bytes: a struct a
// daemon keeps one of per held lock, held to the allocator's size class it
// fits (docs/BENCHMARKS.md "Held locks"). A field added to it must find
// room in its padding, or the test's comment says where such fields go.
func SizeAtMost[T any](t testing.TB, max uintptr) {
	t.Helper()
	var v T
	if n := unsafe.Sizeof(v); n > max {
		t.Errorf("%T is %d bytes, more than the %d of its size class", v, n, max)
	}
}
