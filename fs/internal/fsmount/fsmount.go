// Package fsmount mounts package fs in process for the external test
// packages of fs/control and fs/filelock (package fs's own tests cannot
// import it: it imports fs). The mount is fstest.MountAt's: a real engine
// over the local backend, allow_other, everything undone in t.Cleanup.
package fsmount

import (
	"testing"

	"bazil.org/fuse"
	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/fs"
	"github.com/lockfs/lockfs/fs/internal/fstest"
	"github.com/lockfs/lockfs/lockmgr"
)

// Mount is a mounted lockfs with its file system.
type Mount struct {
	*fstest.Mount
	// FS is the file system served.
	FS *fs.FS
}

// New mounts package fs over src, an existing SOURCE which several mounts
// (daemons) may share, served with fs.Serve.
func New(t *testing.T, src string) *Mount {
	t.Helper()
	var fsys *fs.FS
	m := fstest.MountAt(t, src, func(eng *lockmgr.Engine, log logrus.FieldLogger) (func(*fuse.Conn) error, func() error, error) {
		f, err := fs.New(fs.Config{Source: src, Engine: eng, Logger: log, Host: "testhost"})
		if err != nil {
			return nil, nil, err
		}
		fsys = f
		return func(c *fuse.Conn) error { return fs.Serve(c, f) }, f.Close, nil
	})
	return &Mount{Mount: m, FS: fsys}
}
