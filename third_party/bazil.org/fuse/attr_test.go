package fuse

import (
	"encoding/binary"
	"os"
	"syscall"
	"testing"
	"time"
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

// TestDirentPlusLayout: a READDIRPLUS entry is struct fuse_direntplus, a
// 128-byte fuse_entry_out then a fuse_dirent and the name, padded to 8
// bytes, with the node, generation, validities and attributes where the
// kernel reads them, and DirentPlusSize its length.
func TestDirentPlusLayout(t *testing.T) {
	for _, name := range []string{"a", "seven77", "eight888", "a-longer-name.txt"} {
		entry := LookupResponse{Node: 5, Generation: 3, EntryValid: 1500 * time.Millisecond,
			Attr: Attr{Valid: 2 * time.Second, Inode: 42, Size: 1234, Mode: 0o640, Nlink: 2, Uid: 7, Gid: 8}}
		data := AppendDirentPlus([]byte{}, Dirent{Inode: 42, Type: DT_File, Name: name}, 9, &entry)
		if len(data) != DirentPlusSize(name) || len(data)%8 != 0 {
			t.Fatalf("%q: %d bytes, DirentPlusSize %d; want equal, a multiple of 8", name, len(data), DirentPlusSize(name))
		}
		u64 := func(off int) uint64 { return binary.LittleEndian.Uint64(data[off:]) }
		u32 := func(off int) uint32 { return binary.LittleEndian.Uint32(data[off:]) }
		for _, c := range []struct {
			what      string
			got, want uint64
		}{
			{"nodeid", u64(0), 5}, {"generation", u64(8), 3},
			{"entry_valid", u64(16), 1}, {"attr_valid", u64(24), 2},
			{"entry_valid_nsec", uint64(u32(32)), 500e6}, {"attr_valid_nsec", uint64(u32(36)), 0},
			{"attr.ino", u64(40), 42}, {"attr.size", u64(48), 1234},
			{"attr.mode", uint64(u32(40 + 60)), syscall.S_IFREG | 0o640}, {"attr.nlink", uint64(u32(40 + 64)), 2},
			{"attr.uid", uint64(u32(40 + 68)), 7}, {"attr.gid", uint64(u32(40 + 72)), 8},
			{"dirent.ino", u64(128), 42}, {"dirent.off", u64(136), 9},
			{"dirent.namelen", uint64(u32(144)), uint64(len(name))}, {"dirent.type", uint64(u32(148)), uint64(DT_File)},
		} {
			if c.got != c.want {
				t.Errorf("%q: %s = %d, want %d", name, c.what, c.got, c.want)
			}
		}
		if got := string(data[152 : 152+len(name)]); got != name {
			t.Errorf("name %q, want %q", got, name)
		}
	}
	// An entry without a node carries no attributes (the kernel lists it
	// and links nothing).
	data := AppendDirentPlus(nil, Dirent{Inode: 1, Type: DT_Dir, Name: ".."}, 2, &LookupResponse{Attr: Attr{Inode: 9, Mode: os.ModeDir}})
	for i, b := range data[:128] {
		if b != 0 {
			t.Fatalf("entry_out byte %d of a node-less entry is %d, want 0", i, b)
		}
	}
}
