package fs_test

import (
	"testing"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"
)

// TestProtocol740: on a kernel that speaks 7.40 or later the connection
// negotiates 7.40 with 64-bit flags (InitInitExt) and InitMaxPages.
func TestProtocol740(t *testing.T) {
	conn, _ := mountRec(t, &recFS{file: &recFile{}})
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel %s: protocol %v, features %v", unix.ByteSliceToString(uts.Release[:]), conn.Protocol(), conn.Features())
	if p := conn.Protocol(); p.LT(fuse.Protocol{Major: 7, Minor: 40}) {
		t.Fatalf("protocol %v, want 7.40 (Linux 6.9 or later offers it)", p)
	}
	for _, f := range []fuse.InitFlags{fuse.InitInitExt, fuse.InitMaxPages} {
		if conn.Features()&f == 0 {
			t.Errorf("%v not negotiated", f)
		}
	}
}

// TestMaxPagesRequests: with InitMaxPages a write or direct read of 4 MiB
// reaches the daemon as 1 MiB requests. Control: upstream (no max_pages,
// maxWrite 128 KiB) sends 32 requests of 128 KiB each way.
func TestMaxPagesRequests(t *testing.T) {
	f := &recFile{open: func(req *fuse.OpenRequest, resp *fuse.OpenResponse) error {
		resp.Flags |= fuse.OpenDirectIO // reads as the caller made them, no readahead
		return nil
	}}
	_, dir := mountRec(t, &recFS{file: f})
	fd, err := unix.Open(dir+"/f", unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	const size = 4 << 20
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	if n, err := unix.Pwrite(fd, buf, 0); err != nil || n != size {
		t.Fatalf("pwrite: %d, %v", n, err)
	}
	got := make([]byte, size)
	if n, err := unix.Pread(fd, got, 0); err != nil || n != size {
		t.Fatalf("pread: %d, %v", n, err)
	}
	if string(got) != string(buf) {
		t.Fatal("read back other bytes than written")
	}
	reads, writes := f.counts()
	for what, sizes := range map[string][]int{"read": reads, "write": writes} {
		if len(sizes) != 4 {
			t.Errorf("%d %s requests for 4 MiB, want 4 of 1 MiB: %v", len(sizes), what, sizes)
			continue
		}
		for _, s := range sizes {
			if s != 1<<20 {
				t.Errorf("%s request of %d bytes, want 1 MiB", what, s)
			}
		}
	}
}

// TestConcurrentReadsGetTheirBytes: 1 MiB reads answered at the same time
// from the pooled read buffers, written out with writev, each get the
// bytes at their offset. (A mutation that returns the buffer to the pool
// before the reply is written was not caught in 3 runs on 2 cores: the
// window is short; this checks the slicing and the writev framing.)
func TestConcurrentReadsGetTheirBytes(t *testing.T) {
	const size, readers = 8 << 20, 8
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i / (1 << 20) * 31)
		if i%4096 == 0 {
			data[i] = byte(i >> 12)
		}
	}
	f := &recFile{data: data, open: func(req *fuse.OpenRequest, resp *fuse.OpenResponse) error {
		resp.Flags |= fuse.OpenDirectIO
		return nil
	}}
	_, dir := mountRec(t, &recFS{file: f})
	errs := make(chan string, readers)
	for r := 0; r < readers; r++ {
		go func(r int) {
			fd, err := unix.Open(dir+"/f", unix.O_RDONLY, 0)
			if err != nil {
				errs <- err.Error()
				return
			}
			defer unix.Close(fd)
			buf := make([]byte, 1<<20)
			for round := 0; round < 8; round++ {
				off := int64((r+round)%8) << 20
				n, err := unix.Pread(fd, buf, off)
				if err != nil || n != len(buf) || string(buf) != string(data[off:off+int64(n)]) {
					errs <- "a read got other bytes than the file's"
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
}
