// Command noopfs is the benchmark's transport floor: a bazil FUSE daemon
// with one empty file, "f", whose handle answers every lock request at once
// without keeping any state. Mounted with the same locking options as
// lockfs (LockingFlock and LockingPOSIX), a flock pair on it costs exactly
// the FUSE round trips a lock pair needs, and nothing else.
//
// Usage: noopfs MOUNTPOINT. It serves in the foreground until SIGTERM or
// SIGINT, then unmounts (lazily) and exits.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"bazil.org/fuse"
	fusefs "bazil.org/fuse/fs"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: noopfs MOUNTPOINT")
		os.Exit(2)
	}
	mnt := os.Args[1]
	conn, err := fuse.Mount(mnt, fuse.FSName("noopfs"), fuse.Subtype("noopfs"),
		fuse.LockingFlock(), fuse.LockingPOSIX(), fuse.DefaultPermissions())
	if err != nil {
		fmt.Fprintln(os.Stderr, "noopfs: mount:", err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		if err := fuse.Unmount(mnt); err != nil {
			// Busy: detach it; Serve returns once the kernel lets go.
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	}()
	if err := fusefs.Serve(conn, noopFS{}); err != nil {
		fmt.Fprintln(os.Stderr, "noopfs: serve:", err)
		os.Exit(1)
	}
	conn.Close()
}

type noopFS struct{}

func (noopFS) Root() (fusefs.Node, error) { return dir{}, nil }

// dir is the root directory, holding only "f".
type dir struct{}

var (
	_ fusefs.Node               = dir{}
	_ fusefs.NodeStringLookuper = dir{}
	_ fusefs.HandleReadDirAller = dir{}
)

func (dir) Attr(ctx context.Context, a *fuse.Attr) error {
	a.Inode = 1
	a.Mode = os.ModeDir | 0o755
	a.Nlink = 2
	return nil
}

func (dir) Lookup(ctx context.Context, name string) (fusefs.Node, error) {
	if name == "f" {
		return file{}, nil
	}
	return nil, syscall.ENOENT
}

func (dir) ReadDirAll(ctx context.Context) ([]fuse.Dirent, error) {
	return []fuse.Dirent{{Inode: 2, Name: "f", Type: fuse.DT_File}}, nil
}

// file is "f": opening it returns a handle that grants every lock.
type file struct{}

var (
	_ fusefs.Node              = file{}
	_ fusefs.NodeOpener        = file{}
	_ fusefs.HandleFlockLocker = handle{}
	_ fusefs.HandlePOSIXLocker = handle{}
)

func (file) Attr(ctx context.Context, a *fuse.Attr) error {
	a.Inode = 2
	a.Mode = 0o666
	a.Nlink = 1
	return nil
}

func (file) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fusefs.Handle, error) {
	return handle{}, nil
}

// handle answers every lock request at once.
type handle struct{}

func (handle) Lock(ctx context.Context, req *fuse.LockRequest) error         { return nil }
func (handle) LockWait(ctx context.Context, req *fuse.LockWaitRequest) error { return nil }
func (handle) Unlock(ctx context.Context, req *fuse.UnlockRequest) error     { return nil }
func (handle) QueryLock(ctx context.Context, req *fuse.QueryLockRequest, resp *fuse.QueryLockResponse) error {
	return nil
}
func (handle) Release(ctx context.Context, req *fuse.ReleaseRequest) error { return nil }
func (handle) Flush(ctx context.Context, req *fuse.FlushRequest) error     { return nil }
