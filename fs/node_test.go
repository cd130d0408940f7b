package fs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// fdOpenOn reports whether descriptor fd is open on the inode of st (not
// merely a number reused by another open meanwhile).
func fdOpenOn(fd int, st *unix.Stat_t) bool {
	var got unix.Stat_t
	return unix.Fstat(fd, &got) == nil && got.Dev == st.Dev && got.Ino == st.Ino
}

// A descriptor borrowed from a handle stays open until it is returned,
// even if the handle is released meanwhile; with no borrower, releasing
// the handle closes it.
func TestBorrowOpenOutlivesRelease(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	fdOpen := func(fd int) bool { return fdOpenOn(fd, &st) }
	open := func(flags int) *openFile {
		fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return &openFile{fd: fd, write: flags&unix.O_ACCMODE != unix.O_RDONLY}
	}
	n := &node{fs: &FS{handles: newHandleCap(0)}}
	ro, rw := open(unix.O_RDONLY), open(unix.O_RDWR)
	n.addOpen(ro)
	n.addOpen(rw)

	if got := n.borrowOpen(true); got != rw {
		t.Fatalf("borrowOpen(write) = %+v, want the writable descriptor", got)
	}
	n.releaseOpen(rw)
	if !fdOpen(rw.fd) {
		t.Fatal("released handle's descriptor closed under its borrower")
	}
	n.returnOpen(rw)
	if fdOpen(rw.fd) {
		t.Fatal("last borrower of a released handle left its descriptor open")
	}

	if got := n.borrowOpen(true); got != ro {
		t.Fatalf("borrowOpen(write) with only a read-only handle = %+v, want it", got)
	}
	n.returnOpen(ro)
	if !fdOpen(ro.fd) {
		t.Fatal("returning a borrow closed a handle's descriptor")
	}
	n.releaseOpen(ro)
	if fdOpen(ro.fd) {
		t.Fatal("releasing a handle with no borrower left its descriptor open")
	}
	if got := n.borrowOpen(false); got != nil {
		t.Fatalf("borrowOpen with no handle = %+v, want nil", got)
	}
}
