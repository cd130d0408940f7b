package fs_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"bazil.org/fuse"
	"bazil.org/fuse/fs"
	"golang.org/x/sys/unix"
)

// spliceFile is a regular file whose reads are answered with
// ReadResponse.Splice from a file on disk, opened direct_io so that every
// read(2) reaches the daemon as the caller made it (split at max_read).
type spliceFile struct {
	backing *os.File
	// fd, if set, is the descriptor named in the replies instead of
	// backing's; failed is their Failed.
	fd int

	mu     sync.Mutex
	failed func(error) error // GUARDED_BY(mu)
}

func (f *spliceFile) Attr(ctx context.Context, a *fuse.Attr) error {
	st, err := f.backing.Stat()
	if err != nil {
		return err
	}
	a.Inode = 2
	a.Mode = 0o444
	a.Size = uint64(st.Size())
	return nil
}

func (f *spliceFile) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fs.Handle, error) {
	resp.Flags |= fuse.OpenDirectIO
	return f, nil
}

func (f *spliceFile) Read(ctx context.Context, req *fuse.ReadRequest, resp *fuse.ReadResponse) error {
	fd := int(f.backing.Fd())
	if f.fd != 0 {
		fd = f.fd
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	resp.Splice = &fuse.ReadSplice{FD: fd, Failed: f.failed}
	return nil
}

// newSpliceFile writes size random bytes to a file and returns it open.
func newSpliceFile(t *testing.T, size int) (*spliceFile, []byte) {
	t.Helper()
	data := make([]byte, size)
	rand.New(rand.NewSource(1)).Read(data)
	p := filepath.Join(t.TempDir(), "backing")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &spliceFile{backing: b}, data
}

// TestSpliceReadsGetTheirBytes: reads answered by splice, at aligned and
// unaligned offsets, across the end of the file and past it, return the
// file's bytes, and all but the short ones at the end go out by splice.
// Control: without MaxRead(SpliceReadMax()) a 1 MiB read does not fit a
// pipe with its header; it is answered through Data, with the same bytes,
// and SplicedReads does not count it.
func TestSpliceReadsGetTheirBytes(t *testing.T) {
	max := fuse.SpliceReadMax()
	if max < 64<<10 {
		t.Fatalf("SpliceReadMax %d: /proc/sys/fs/pipe-max-size lets no pipe carry a 64 KiB read", max)
	}
	const size = 3<<20 + 1234
	f, data := newSpliceFile(t, size)
	reads := []struct{ off, n int }{
		{0, 1 << 20},            // max_read splits it: max bytes, then the rest
		{4097, 200000},          // unaligned: one page more than aligned
		{2 << 20, max},          // exactly max_read
		{size - 5000, 1 << 20},  // across the end: short, answered through Data
		{size + 10, 4096},       // past the end: nothing
		{1<<20 + 17, 64 << 10},  // small and unaligned
		{size - 1234, 1234 + 1}, // the tail, one byte past the end
	}
	check := func(t *testing.T, dir string) {
		t.Helper()
		fd, err := unix.Open(dir+"/f", unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		for _, r := range reads {
			buf := make([]byte, r.n)
			got, err := unix.Pread(fd, buf, int64(r.off))
			if err != nil {
				t.Fatalf("pread %d at %d: %v", r.n, r.off, err)
			}
			want := data[min(r.off, size):min(r.off+r.n, size)]
			if !bytes.Equal(buf[:got], want) {
				t.Errorf("pread %d at %d: %d bytes, not the file's %d", r.n, r.off, got, len(want))
			}
		}
	}
	conn, dir := mountRec(t, &recFS{node: f}, fuse.MaxRead(uint32(max)))
	check(t, dir)
	// By splice: both requests of the first read, the next two reads,
	// the small one. Through Data: the three that reach past the end.
	if n := conn.SplicedReads(); n < 5 {
		t.Errorf("%d reads answered by splice, want at least 5 of the %d requests", n, len(reads)+1)
	}

	ctl, cdir := mountRec(t, &recFS{node: f})
	fd, err := unix.Open(cdir+"/f", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 1<<20)
	if got, err := unix.Pread(fd, buf, 0); err != nil || !bytes.Equal(buf[:got], data[:1<<20]) {
		t.Fatalf("control: pread 1 MiB: %d bytes, %v; want the file's first MiB", got, err)
	}
	if n := ctl.SplicedReads(); n != 0 {
		t.Errorf("control: %d reads of 1 MiB answered by splice, want 0 (they do not fit a pipe with their header)", n)
	}
}

// TestSpliceReadFailureAnswersFailedsError: when neither splice nor pread
// can read the file (a directory's descriptor), the reader gets the error
// that Failed returns. Control: without Failed, the read's own error
// (EISDIR).
func TestSpliceReadFailureAnswersFailedsError(t *testing.T) {
	f, _ := newSpliceFile(t, 1<<20)
	d, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(d)
	told := make(chan error, 1)
	f.fd = d
	f.failed = func(err error) error {
		select {
		case told <- err:
		default: // told once already
		}
		return syscall.EXDEV
	}
	conn, dir := mountRec(t, &recFS{node: f}, fuse.MaxRead(uint32(fuse.SpliceReadMax())))
	read := func() error {
		fd, err := unix.Open(dir+"/f", unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		_, err = unix.Pread(fd, make([]byte, 64<<10), 0)
		return err
	}
	if err := read(); err != syscall.EXDEV {
		t.Errorf("pread: %v, want Failed's EXDEV", err)
	}
	if err := <-told; err != syscall.EISDIR {
		t.Errorf("Failed was told %v, want the pread's EISDIR", err)
	}
	f.mu.Lock()
	f.failed = nil
	f.mu.Unlock()
	if err := read(); err != syscall.EISDIR {
		t.Errorf("control, no Failed: pread: %v, want EISDIR", err)
	}
	if n := conn.SplicedReads(); n != 0 {
		t.Errorf("%d reads of a directory answered by splice", n)
	}
}

// TestConcurrentSpliceReads: eight readers at once, each through its own
// descriptor, get the file's bytes at their offsets while their replies go
// through the connection's pool of pipes; a pipe shared by two replies at
// once, or put back with bytes in it, would mix them up.
func TestConcurrentSpliceReads(t *testing.T) {
	const size, readers = 8 << 20, 8
	f, data := newSpliceFile(t, size)
	conn, dir := mountRec(t, &recFS{node: f}, fuse.MaxRead(uint32(fuse.SpliceReadMax())))
	errs := make(chan string, readers)
	for r := 0; r < readers; r++ {
		go func(r int) {
			fd, err := unix.Open(dir+"/f", unix.O_RDONLY, 0)
			if err != nil {
				errs <- err.Error()
				return
			}
			defer unix.Close(fd)
			rnd := rand.New(rand.NewSource(int64(r)))
			for round := 0; round < 16; round++ {
				off := rnd.Intn(size)
				n := 32<<10 + rnd.Intn(1<<20)
				buf := make([]byte, n)
				got, err := unix.Pread(fd, buf, int64(off))
				if err != nil || !bytes.Equal(buf[:got], data[off:min(off+n, size)]) {
					errs <- fmt.Sprintf("reader %d: pread %d at %d: %d bytes, %v; not the file's", r, n, off, got, err)
					return
				}
			}
			errs <- ""
		}(r)
	}
	for r := 0; r < readers; r++ {
		if e := <-errs; e != "" {
			t.Error(e)
		}
	}
	if conn.SplicedReads() == 0 {
		t.Error("no read answered by splice")
	}
}
