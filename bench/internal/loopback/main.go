// Command loopback is the benchmark's peer FUSE passthrough: go-fuse's
// loopback file system (github.com/hanwen/go-fuse/v2/fs.NewLoopbackRoot),
// mounted with the options of go-fuse's own example/loopback (one-second
// entry and attribute timeouts).
//
// go-fuse's loopback files use the kernel's FUSE passthrough where the
// kernel offers it (Linux 6.9 and later, as root): reads and writes of an
// open file then go from the kernel to the backing file without reaching
// the daemon. With -no-passthrough they do not: every read and write is a
// FUSE request served by the daemon, as in lockfs (bazil.org/fuse has no
// passthrough), which tells the transport's cost from the daemon's.
//
// With -default-permissions it is mounted with the kernel's
// default_permissions, as lockfs always is (docs/SPEC.md §7): the kernel
// then checks permissions itself from attributes, which costs GETATTRs
// that a mount without it does not send; the meta ops goal compares like
// with like against this mount (docs/BENCHMARKS.md, `meta_ops_ratio_vs_gofuse_default_permissions`).
//
// Usage: loopback [-no-passthrough] [-default-permissions] SOURCE
// MOUNTPOINT. It serves in the foreground until SIGTERM or SIGINT, then
// unmounts and exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	noPT := flag.Bool("no-passthrough", false, "serve every read and write in the daemon (no kernel FUSE passthrough)")
	defPerm := flag.Bool("default-permissions", false, "mount with default_permissions: the kernel checks permissions, as on a lockfs mount")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: loopback [-no-passthrough] [-default-permissions] SOURCE MOUNTPOINT")
		os.Exit(2)
	}
	src, mnt := flag.Arg(0), flag.Arg(1)
	root, err := newRoot(src, *noPT)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopback:", err)
		os.Exit(1)
	}
	sec := time.Second
	mopts := fuse.MountOptions{FsName: src, Name: "loopback"}
	if *defPerm {
		mopts.Options = append(mopts.Options, "default_permissions")
	}
	server, err := fs.Mount(mnt, root, &fs.Options{
		AttrTimeout:     &sec,
		EntryTimeout:    &sec,
		NullPermissions: true,
		MountOptions:    mopts,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopback: mount:", err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		if err := server.Unmount(); err != nil {
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	}()
	server.Wait()
}

// newRoot is fs.NewLoopbackRoot, with every node a noPTNode if noPT.
func newRoot(src string, noPT bool) (fs.InodeEmbedder, error) {
	if !noPT {
		return fs.NewLoopbackRoot(src)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(src, &st); err != nil {
		return nil, err
	}
	data := &fs.LoopbackRoot{Path: src, Dev: uint64(st.Dev)}
	data.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &noPTNode{fs.LoopbackNode{RootData: r}}
	}
	root := &noPTNode{fs.LoopbackNode{RootData: data}}
	data.RootNode = root
	return root, nil
}

// noPTNode is a loopback node whose open files refuse passthrough.
type noPTNode struct{ fs.LoopbackNode }

var (
	_ fs.NodeOpener  = (*noPTNode)(nil)
	_ fs.NodeCreater = (*noPTNode)(nil)
)

func (n *noPTNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	return noPT(fh), fl, errno
}

func (n *noPTNode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return in, noPT(fh), fl, errno
}

// noPTFile is a loopback file that declines passthrough (go-fuse asks
// PassthroughFd; false means "serve it in the daemon").
type noPTFile struct{ *fs.LoopbackFile }

func (noPTFile) PassthroughFd() (int, bool) { return -1, false }

func noPT(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return noPTFile{lf}
	}
	return fh
}
