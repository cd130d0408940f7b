package fs

import (
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Open handles per user.
//
// Every open directory handle, and every open file handle that is not
// detached (detach.go: a passthrough open holds none but while it is
// flocked), holds a backing descriptor in the daemon, and the daemon's
// descriptor table is shared by every user of the mount: one user opening
// files until EMFILE would leave no descriptor for anybody else's lookup,
// stat or readlink (each needs one for a moment). So the handles of each uid (the fsuid of the request that opened them)
// are capped at Config.MaxOpenPerUID: the user who reaches it gets EMFILE,
// as from their own descriptor table, and everyone else is served. The
// descriptor that carries a process's byte-range locks on a file
// (package filelock) counts too, and so does a detached handle's flock
// descriptor; at the cap a new one is refused with ENOLCK.
// Control files hold no descriptor and are not counted.

// handleCap counts open handles per uid.
type handleCap struct {
	// Constant data
	max int // 0: no cap

	// Mutable state
	mu sync.Mutex
	// open counts each uid's open handles. GUARDED_BY(mu)
	open map[uint32]int
	// refusing marks the uids refused since they were last below the cap,
	// so that a user who keeps trying is logged once. GUARDED_BY(mu)
	refusing map[uint32]bool
}

func newHandleCap(max int) *handleCap {
	return &handleCap{max: max, open: make(map[uint32]int), refusing: make(map[uint32]bool)}
}

// take counts a new handle of uid; false (and nothing counted) if uid is
// at the cap. first reports whether this is uid's first refusal since it
// was last below the cap.
func (c *handleCap) take(uid uint32) (ok, first bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.max > 0 && c.open[uid] >= c.max {
		first = !c.refusing[uid]
		c.refusing[uid] = true
		return false, first
	}
	c.open[uid]++
	return true, false
}

// count returns the number of handles counted for uid.
func (c *handleCap) count(uid uint32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open[uid]
}

// give uncounts a handle of uid.
func (c *handleCap) give(uid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[uid]--; c.open[uid] <= 0 {
		delete(c.open, uid)
	}
	delete(c.refusing, uid)
}

// takeHandle counts a new handle of uid for op on path, or logs and returns
// EMFILE if uid is at its cap.
func (f *FS) takeHandle(op string, path func() string, uid uint32) error {
	ok, first := f.handles.take(uid)
	if ok {
		return nil
	}
	e := f.log.WithFields(logrus.Fields{"op": op, "path": path(), "uid": uid, "max_open_per_uid": f.handles.max,
		"errno": unix.ErrnoName(syscall.EMFILE)})
	if first {
		e.Warn("request refused: the user has as many files open through the mount as allowed (--max-open-per-uid)")
	} else {
		e.Debug("request refused: open file limit of the user")
	}
	return syscall.EMFILE
}
