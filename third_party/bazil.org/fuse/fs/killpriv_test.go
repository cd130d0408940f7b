package fs_test

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"

	"bazil.org/fuse"
	"bazil.org/fuse/fs"
)

// createFS is a root directory whose Create records the open flags of
// each create request.
type createFS struct {
	mu    sync.Mutex
	flags []fuse.OpenRequestFlags
}

func (c *createFS) Root() (fs.Node, error) { return createDir{c}, nil }

type createDir struct{ fs *createFS }

func (d createDir) Attr(ctx context.Context, a *fuse.Attr) error {
	a.Inode = 1
	a.Mode = os.ModeDir | 0o777
	return nil
}

func (d createDir) Lookup(ctx context.Context, name string) (fs.Node, error) {
	return nil, syscall.ENOENT
}

func (d createDir) Create(ctx context.Context, req *fuse.CreateRequest, resp *fuse.CreateResponse) (fs.Node, fs.Handle, error) {
	d.fs.mu.Lock()
	d.fs.flags = append(d.fs.flags, req.OpenFlags)
	d.fs.mu.Unlock()
	f := &recFile{}
	return f, f, nil
}

// TestCreateKillSUIDGID: with HandleKillPriv, a create with O_TRUNC by a
// process without CAP_FSETID carries FUSE_OPEN_KILL_SUIDGID in
// CreateRequest.OpenFlags (the field upstream read as padding). Control:
// the same create by a process with CAP_FSETID carries no flag.
func TestCreateKillSUIDGID(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatalf("setpriv (util-linux) is needed: %v", err)
	}
	c := &createFS{}
	_, dir := mountRec(t, c, fuse.HandleKillPriv(), fuse.DefaultPermissions())
	for _, cmd := range [][]string{
		{"sh", "-c", ": >" + dir + "/with"},
		{"setpriv", "--bounding-set", "-fsetid", "--inh-caps", "-fsetid", "sh", "-c", ": >" + dir + "/without"},
	} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.flags) != 2 {
		t.Fatalf("%d create requests, want 2", len(c.flags))
	}
	if c.flags[0]&fuse.OpenKillSUIDGID != 0 {
		t.Errorf("control: a create by root with CAP_FSETID carries %v", c.flags[0])
	}
	if c.flags[1]&fuse.OpenKillSUIDGID == 0 {
		t.Errorf("a create with O_TRUNC without CAP_FSETID carries %v, want OpenKillSUIDGID", c.flags[1])
	}
}
