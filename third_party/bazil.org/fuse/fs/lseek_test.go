package fs_test

import (
	"context"
	"testing"

	"bazil.org/fuse"
	"bazil.org/fuse/fs"
	"golang.org/x/sys/unix"
)

// seekFile is a 1 MiB file whose only data is [4096, 8192): its handle
// answers SEEK_DATA and SEEK_HOLE (fs.HandleLseeker).
type seekFile struct{ *recFile }

func (f seekFile) Attr(ctx context.Context, a *fuse.Attr) error {
	a.Inode = 2
	a.Mode = 0o666
	a.Size = 1 << 20
	return nil
}

func (f seekFile) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fs.Handle, error) {
	return f, nil
}

func (f seekFile) Lseek(ctx context.Context, req *fuse.LseekRequest, resp *fuse.LseekResponse) error {
	switch {
	case req.Whence == unix.SEEK_DATA && req.Offset < 8192:
		resp.Offset = max(req.Offset, 4096)
	case req.Whence == unix.SEEK_DATA:
		return unix.ENXIO
	case req.Whence == unix.SEEK_HOLE && req.Offset >= 4096 && req.Offset < 8192:
		resp.Offset = 8192
	default:
		resp.Offset = req.Offset
	}
	return nil
}

// TestLseekDataHole: SEEK_DATA and SEEK_HOLE through the mount get the
// handle's answers (FUSE_LSEEK). Control: a handle without Lseek, where
// the kernel sees the whole file as data.
func TestLseekDataHole(t *testing.T) {
	seek := func(dir string, off int64, whence int) (int64, error) {
		fd, err := unix.Open(dir+"/f", unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		return unix.Seek(fd, off, whence)
	}
	_, dir := mountRec(t, &recFS{node: seekFile{&recFile{}}})
	for _, c := range []struct {
		off    int64
		whence int
		want   int64
		err    error
	}{
		{0, unix.SEEK_DATA, 4096, nil},
		{4096, unix.SEEK_HOLE, 8192, nil},
		{8192, unix.SEEK_DATA, -1, unix.ENXIO},
	} {
		got, err := seek(dir, c.off, c.whence)
		if got != c.want || err != c.err {
			t.Errorf("lseek(%d, %d) = %d, %v; want %d, %v", c.off, c.whence, got, err, c.want, c.err)
		}
	}

	f := &recFile{data: make([]byte, 1<<20)}
	_, plain := mountRec(t, &recFS{file: f})
	if got, err := seek(plain, 0, unix.SEEK_HOLE); err != nil || got != 1<<20 {
		t.Errorf("control: SEEK_HOLE without Lseek = %d, %v; want the file size", got, err)
	}
}
