package fuse

import (
	"os"
	"syscall"
	"testing"
)

// TestAttrModeBits: every permission and special bit of an os.FileMode
// reaches the kernel's mode, and fileMode (the decoder of the kernel's
// modes in requests) is its inverse. Upstream dropped os.ModeSticky here:
// before the fix the 01777 and 01755 cases fail.
func TestAttrModeBits(t *testing.T) {
	for _, unixMode := range []uint32{
		syscall.S_IFDIR | 0o1777,
		syscall.S_IFDIR | 0o1755,
		syscall.S_IFREG | 0o4755,
		syscall.S_IFREG | 0o2711,
		syscall.S_IFREG | 0o7777,
		syscall.S_IFLNK | 0o777,
		syscall.S_IFIFO | 0o644,
	} {
		a := Attr{Mode: fileMode(unixMode)}
		var out attr
		a.attr(&out, Protocol{7, 40})
		if out.Mode != unixMode {
			t.Errorf("mode %#o: encoded as %#o", unixMode, out.Mode)
		}
	}
	if m := fileMode(syscall.S_IFDIR | 0o1777); m != os.ModeDir|os.ModeSticky|0o777 {
		t.Errorf("fileMode(01777 dir) = %v", m)
	}
}
