package resolve

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS

// deep makes a chain of n directories named name below root, one at a time
// through descriptors (the path is longer than PATH_MAX), and returns the
// path relative to root.
func deep(t *testing.T, root, name string, n int) string {
	t.Helper()
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for i := 0; i < n; i++ {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		nfd, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = nfd
		parts = append(parts, name)
	}
	unix.Close(fd)
	return strings.Join(parts, "/")
}

func TestOpenat2LongPath(t *testing.T) {
	root := t.TempDir()
	rel := deep(t, root, strings.Repeat("d", 200), 30) // 6029 bytes
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rfd)
	how := &unix.OpenHow{Flags: unix.O_RDWR | unix.O_CREAT | unix.O_CLOEXEC, Mode: 0o644, Resolve: beneath}
	fd, err := Openat2(rfd, rel+"/f", how)
	if err != nil {
		t.Fatalf("open of a %d-byte path: %v", len(rel)+2, err)
	}
	unix.Close(fd)
	var st unix.Stat_t
	if err := Lstat(rfd, rel+"/f", beneath, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		t.Fatalf("Lstat: %v, mode %#o", err, st.Mode)
	}
	// Control: the kernel alone refuses it.
	if _, err := unix.Openat2(rfd, rel+"/f", how); !errors.Is(err, unix.ENAMETOOLONG) {
		t.Fatalf("openat2 of the whole path: %v, want ENAMETOOLONG", err)
	}
	// Every piece stays beneath and crosses no symlink: ".." that would
	// leave root is refused, and so is a symlink in the middle.
	up := strings.Repeat("../", 31)
	if _, err := Openat2(rfd, rel+"/"+up+"x", how); !errors.Is(err, unix.EXDEV) {
		t.Errorf("a long path leaving root: %v, want EXDEV", err)
	}
	mid := rel[:strings.Index(rel[2100:], "/")+2100]
	if err := os.Rename(filepath.Join(root, mid), filepath.Join(root, "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "moved"), filepath.Join(root, mid)); err != nil {
		t.Fatal(err)
	}
	if _, err := Openat2(rfd, rel+"/f", how); !errors.Is(err, unix.ELOOP) {
		t.Errorf("a long path through a symlink: %v, want ELOOP", err)
	}
}
