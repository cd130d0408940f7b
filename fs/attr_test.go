package fs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTopStatFollowsNoSymlink: the attributes of a directory in SOURCE's
// top directory are read with one statx of its name (statTop). After top/
// is moved to top2/ in SOURCE and a symlink top → top2 put in its place,
// lstat of top through the mount reports the symlink, as the openat2
// lookup of deeper paths would. The kernel asks for top's attributes then
// because a create through the mount made them stale, while its binding
// of the name is still fresh (entryValid). Control: with statTop following
// symlinks, lstat reports top2's directory under top's name.
func TestTopStatFollowsNoSymlink(t *testing.T) {
	for _, c := range []struct {
		name    string
		flags   int
		wantDir bool
	}{
		{"nofollow", unix.AT_SYMLINK_NOFOLLOW, false},
		{"control-follow", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Restored after the unmount (cleanups run last first).
			t.Cleanup(func() { topStatFlags = unix.AT_SYMLINK_NOFOLLOW })
			topStatFlags = c.flags
			m := newPTMount(t)
			if err := os.Mkdir(filepath.Join(m.src, "top"), 0o755); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(m.mnt, "top"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				t.Fatalf("lstat of top through the mount: mode %o, %v; want a directory", st.Mode, err)
			}
			// Makes top's attributes stale in the kernel (fuse_dir_changed).
			if err := os.WriteFile(filepath.Join(m.mnt, "top", "f"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(m.src, "top"), filepath.Join(m.src, "top2")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("top2", filepath.Join(m.src, "top")); err != nil {
				t.Fatal(err)
			}
			if err := unix.Lstat(filepath.Join(m.mnt, "top"), &st); err != nil {
				t.Fatalf("lstat of top after the change: %v", err)
			}
			isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
			if isDir != c.wantDir {
				t.Errorf("lstat of top after it became a symlink in SOURCE: mode %o (directory %v, want %v)", st.Mode, isDir, c.wantDir)
			}
		})
	}
}
