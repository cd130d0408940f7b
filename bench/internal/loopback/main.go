// Command loopback is the benchmark's peer FUSE passthrough: go-fuse's
// loopback file system (github.com/hanwen/go-fuse/v2/fs.NewLoopbackRoot),
// mounted with the options of go-fuse's own example/loopback (one-second
// entry and attribute timeouts).
//
// Usage: loopback SOURCE MOUNTPOINT. It serves in the foreground until
// SIGTERM or SIGINT, then unmounts and exits.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: loopback SOURCE MOUNTPOINT")
		os.Exit(2)
	}
	src, mnt := os.Args[1], os.Args[2]
	root, err := fs.NewLoopbackRoot(src)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopback:", err)
		os.Exit(1)
	}
	sec := time.Second
	server, err := fs.Mount(mnt, root, &fs.Options{
		AttrTimeout:     &sec,
		EntryTimeout:    &sec,
		NullPermissions: true,
		MountOptions:    fuse.MountOptions{FsName: src, Name: "loopback"},
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
