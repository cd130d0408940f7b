package fs_test

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"bazil.org/fuse"
	"bazil.org/fuse/fs"
)

// The fork's own mounted tests (PATCHES.md) serve a one-file tree from
// memory and record the requests the kernel sends. They need root and
// /dev/fuse, as lockfs's tests do, and fail, not skip, without them.

// recFS is a root directory holding one regular file, "f", whose handles
// record every read and write request's size.
type recFS struct {
	file *recFile
	// node, if set, is served as "f" instead of file.
	node fs.Node
}

func (r *recFS) Root() (fs.Node, error) { return recDir{r}, nil }

type recDir struct{ fs *recFS }

func (d recDir) Attr(ctx context.Context, a *fuse.Attr) error {
	a.Inode = 1
	a.Mode = os.ModeDir | 0o755
	return nil
}

func (d recDir) Lookup(ctx context.Context, name string) (fs.Node, error) {
	if name == "f" && d.fs.node != nil {
		return d.fs.node, nil
	}
	if name == "f" {
		return d.fs.file, nil
	}
	return nil, syscall.ENOENT
}

// recFile is "f". open, if set, answers its opens.
type recFile struct {
	open func(req *fuse.OpenRequest, resp *fuse.OpenResponse) error

	mu     sync.Mutex
	data   []byte
	reads  []int // sizes of the read requests, in order
	writes []int // sizes of the write requests, in order
}

func (f *recFile) Attr(ctx context.Context, a *fuse.Attr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	a.Inode = 2
	a.Mode = 0o666
	a.Size = uint64(len(f.data))
	return nil
}

func (f *recFile) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fs.Handle, error) {
	if f.open != nil {
		if err := f.open(req, resp); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (f *recFile) Setattr(ctx context.Context, req *fuse.SetattrRequest, resp *fuse.SetattrResponse) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Valid.Size() {
		f.data = append([]byte(nil), f.data[:min(int(req.Size), len(f.data))]...)
		f.data = append(f.data, make([]byte, int(req.Size)-len(f.data))...)
	}
	resp.Attr.Inode = 2
	resp.Attr.Mode = 0o666
	resp.Attr.Size = uint64(len(f.data))
	return nil
}

func (f *recFile) Read(ctx context.Context, req *fuse.ReadRequest, resp *fuse.ReadResponse) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads = append(f.reads, req.Size)
	if req.Offset < int64(len(f.data)) {
		resp.Data = append(resp.Data[:0], f.data[req.Offset:min(int(req.Offset)+req.Size, len(f.data))]...)
	}
	return nil
}

func (f *recFile) Write(ctx context.Context, req *fuse.WriteRequest, resp *fuse.WriteResponse) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, len(req.Data))
	end := int(req.Offset) + len(req.Data)
	if end > len(f.data) {
		f.data = append(f.data, make([]byte, end-len(f.data))...)
	}
	copy(f.data[req.Offset:], req.Data)
	resp.Size = len(req.Data)
	return nil
}

// counts returns how many read and write requests f has seen.
func (f *recFile) counts() (reads, writes []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.reads...), append([]int(nil), f.writes...)
}

// mountRec mounts fsys at a fresh directory and serves it until the test
// ends; cleanup unmounts (lazily if busy) and waits for Serve.
func mountRec(t *testing.T, fsys fs.FS, opts ...fuse.MountOption) (*fuse.Conn, string) {
	t.Helper()
	return mountRecConfig(t, fsys, nil, opts...)
}

// mountRecConfig is mountRec with a server configuration.
func mountRecConfig(t *testing.T, fsys fs.FS, cfg *fs.Config, opts ...fuse.MountOption) (*fuse.Conn, string) {
	t.Helper()
	_, conn, dir := mountRecServer(t, fsys, cfg, opts...)
	return conn, dir
}

// mountRecServer is mountRecConfig that returns the server too.
func mountRecServer(t *testing.T, fsys fs.FS, cfg *fs.Config, opts ...fuse.MountOption) (*fs.Server, *fuse.Conn, string) {
	t.Helper()
	dir := t.TempDir()
	conn, err := fuse.Mount(dir, opts...)
	if err != nil {
		t.Fatalf("mount (needs root and /dev/fuse): %v", err)
	}
	served := make(chan error, 1)
	srv := fs.New(conn, cfg)
	go func() { served <- srv.Serve(fsys) }()
	t.Cleanup(func() {
		if err := fuse.Unmount(dir); err != nil {
			if out, err := exec.Command("fusermount3", "-uz", dir).CombinedOutput(); err != nil {
				t.Errorf("fusermount3 -uz %s: %v: %s", dir, err, out)
			}
		}
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("Serve did not return after unmount")
		}
		conn.Close()
	})
	return srv, conn, dir
}
