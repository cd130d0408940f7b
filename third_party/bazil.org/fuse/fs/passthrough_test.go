package fs_test

import (
	"bytes"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"
)

// ptFile mounts a recFS whose file "f" is backed by a fresh file in a
// temporary directory; with passthrough its opens name that file by a
// backing id registered once. It returns the mount's directory, the
// backing file's path and f.
func ptFile(t *testing.T, passthrough bool) (string, string, *recFile) {
	t.Helper()
	backing := t.TempDir() + "/backing"
	if err := os.WriteFile(backing, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	f := &recFile{}
	var opts []fuse.MountOption
	if passthrough {
		opts = append(opts, fuse.Passthrough(1))
	}
	var conn atomic.Pointer[fuse.Conn] // set before the first open
	var mu sync.Mutex
	var id int32 // GUARDED_BY(mu)
	f.open = func(req *fuse.OpenRequest, resp *fuse.OpenResponse) error {
		if !passthrough {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if id == 0 {
			fd, err := unix.Open(backing, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			// The kernel keeps its own reference: close ours at once.
			id, err = conn.Load().BackingOpen(fd)
			unix.Close(fd)
			if err != nil {
				t.Errorf("BACKING_OPEN: %v", err)
				return err
			}
		}
		resp.Flags |= fuse.OpenPassthrough
		resp.BackingID = id
		return nil
	}
	c, dir := mountRec(t, &recFS{file: f}, opts...)
	conn.Store(c)
	if passthrough && c.Features()&fuse.InitPassthrough == 0 {
		t.Fatalf("passthrough not negotiated: %v", c.Features())
	}
	if !passthrough && c.Features()&fuse.InitPassthrough != 0 {
		t.Fatalf("passthrough negotiated unasked: %v", c.Features())
	}
	return dir, backing, f
}

// TestPassthroughBypassesDaemon: with OpenPassthrough and a backing id, a
// write and a read through the mount go to the backing file and the
// daemon sees neither. Control: the same without passthrough, where the
// daemon sees both and the backing file stays empty.
func TestPassthroughBypassesDaemon(t *testing.T) {
	want := bytes.Repeat([]byte("passthrough "), 1000)
	for _, pt := range []bool{true, false} {
		dir, backing, f := ptFile(t, pt)
		fd, err := unix.Open(dir+"/f", unix.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := unix.Pwrite(fd, want, 0); err != nil || n != len(want) {
			t.Fatalf("passthrough=%v: pwrite: %d, %v", pt, n, err)
		}
		got := make([]byte, len(want))
		if n, err := unix.Pread(fd, got, 0); err != nil || n != len(want) || !bytes.Equal(got, want) {
			t.Fatalf("passthrough=%v: pread: %d, %v", pt, n, err)
		}
		unix.Close(fd)
		onDisk, err := os.ReadFile(backing)
		if err != nil {
			t.Fatal(err)
		}
		reads, writes := f.counts()
		if pt {
			if len(reads) != 0 || len(writes) != 0 {
				t.Errorf("passthrough: the daemon saw %d reads, %d writes, want none", len(reads), len(writes))
			}
			if !bytes.Equal(onDisk, want) {
				t.Errorf("passthrough: backing file holds %d bytes, want what was written", len(onDisk))
			}
		} else {
			if len(reads) == 0 || len(writes) == 0 {
				t.Errorf("control: the daemon saw %d reads, %d writes, want some", len(reads), len(writes))
			}
			if len(onDisk) != 0 {
				t.Errorf("control: backing file holds %d bytes, want none", len(onDisk))
			}
		}
	}
}

// TestBackingCloseKeepsOpenFiles: an open file keeps its backing file
// after the id is dropped; an open naming a dropped id fails.
func TestBackingCloseKeepsOpenFiles(t *testing.T) {
	backing := t.TempDir() + "/backing"
	if err := os.WriteFile(backing, []byte("kept"), 0o666); err != nil {
		t.Fatal(err)
	}
	f := &recFile{}
	var id atomic.Int32
	f.open = func(req *fuse.OpenRequest, resp *fuse.OpenResponse) error {
		resp.Flags |= fuse.OpenPassthrough
		resp.BackingID = id.Load()
		return nil
	}
	conn, dir := mountRec(t, &recFS{file: f}, fuse.Passthrough(1))
	fd, err := unix.Open(backing, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	bid, err := conn.BackingOpen(fd)
	unix.Close(fd)
	if err != nil {
		t.Fatalf("BACKING_OPEN: %v", err)
	}
	id.Store(bid)
	mfd, err := unix.Open(dir+"/f", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	if err := conn.BackingClose(bid); err != nil {
		t.Fatalf("BACKING_CLOSE: %v", err)
	}
	buf := make([]byte, 16)
	if n, err := unix.Pread(mfd, buf, 0); err != nil || string(buf[:n]) != "kept" {
		t.Errorf("read after BACKING_CLOSE: %q, %v", buf[:n], err)
	}
	if fd2, err := unix.Open(dir+"/f", unix.O_RDONLY, 0); err == nil {
		unix.Close(fd2)
		t.Error("an open naming a closed backing id succeeded")
	}
	if err := conn.BackingClose(bid); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("second BACKING_CLOSE: %v, want ENOENT", err)
	}
}

// TestPassthroughNotWithWritebackCache: the kernel refuses passthrough
// with a writeback cache (silently), so the mount does not ask for both.
func TestPassthroughNotWithWritebackCache(t *testing.T) {
	conn, _ := mountRec(t, &recFS{file: &recFile{}}, fuse.Passthrough(1), fuse.WritebackCache())
	if fl := conn.Features(); fl&fuse.InitPassthrough != 0 || fl&fuse.InitWritebackCache == 0 {
		t.Errorf("features %v: want the writeback cache without passthrough", fl)
	}
	if _, err := fuse.Mount(t.TempDir(), fuse.Passthrough(0)); err == nil {
		t.Error("Passthrough(0) accepted; the kernel would turn passthrough off")
	}
}
