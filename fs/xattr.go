package fs

import (
	"context"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"
)

// Extended attributes act on the inode through /proc/self/fd/N, which
// reaches a symlink itself, not its target.

// Getxattr returns an extended attribute.
func (n *node) Getxattr(ctx context.Context, req *fuse.GetxattrRequest, resp *fuse.GetxattrResponse) error {
	err := n.withFd(false, func(fd int) error {
		p := procFdPath(fd)
		for {
			sz, err := unix.Getxattr(p, req.Name, nil)
			if err != nil {
				return err
			}
			buf := make([]byte, sz)
			got, err := unix.Getxattr(p, req.Name, buf)
			if err == unix.ERANGE {
				continue // grew in between
			}
			if err != nil {
				return err
			}
			resp.Xattr = buf[:got]
			return nil
		}
	})
	if err != nil {
		return n.fs.fail("getxattr", n.path(), err)
	}
	return nil
}

// Listxattr lists the extended attribute names.
func (n *node) Listxattr(ctx context.Context, req *fuse.ListxattrRequest, resp *fuse.ListxattrResponse) error {
	err := n.withFd(false, func(fd int) error {
		p := procFdPath(fd)
		for {
			sz, err := unix.Listxattr(p, nil)
			if err != nil {
				return err
			}
			buf := make([]byte, sz)
			got, err := unix.Listxattr(p, buf)
			if err == unix.ERANGE {
				continue
			}
			if err != nil {
				return err
			}
			resp.Xattr = buf[:got]
			return nil
		}
	})
	if err != nil {
		return n.fs.fail("listxattr", n.path(), err)
	}
	return nil
}

// Setxattr sets an extended attribute (XATTR_CREATE and XATTR_REPLACE pass
// through).
func (n *node) Setxattr(ctx context.Context, req *fuse.SetxattrRequest) error {
	err := n.withFd(false, func(fd int) error {
		return unix.Setxattr(procFdPath(fd), req.Name, req.Xattr, int(req.Flags))
	})
	if err != nil {
		return n.fs.fail("setxattr", n.path(), err)
	}
	return nil
}

// Removexattr removes an extended attribute.
func (n *node) Removexattr(ctx context.Context, req *fuse.RemovexattrRequest) error {
	err := n.withFd(false, func(fd int) error {
		return unix.Removexattr(procFdPath(fd), req.Name)
	})
	if err != nil {
		return n.fs.fail("removexattr", n.path(), err)
	}
	return nil
}
