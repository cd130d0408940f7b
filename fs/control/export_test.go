package control

import "github.com/lockfs/lockfs/lockmgr"

// Test seams, for the mount tests of package control_test.

// SetFollowRenames turns off (or on) the following of a renamed directory
// by a lock request (lock.go, # Renames), so that a test's control can run
// the old path, which asked once under the path of the request's start.
// It returns the function that restores the setting. Not for concurrent
// use: tests call it before they mount.
func SetFollowRenames(on bool) (restore func()) {
	old := followRenames
	followRenames = on
	return func() { followRenames = old }
}

// SetParkLockWaits turns off (or on) the parking of waiting lock requests
// in the engine (lock.go, LockWaitDeferred), so that a test's control can
// wait on the serving goroutine, the old path. It returns the function
// that restores the setting. Not for concurrent use: tests call it before
// they mount.
func SetParkLockWaits(on bool) (restore func()) {
	old := parkLockWaits
	parkLockWaits = on
	return func() { parkLockWaits = old }
}

// OpenHandles returns the number of open file descriptions of id's control
// file that the kernel has not yet released, so that a test can wait for
// an asynchronous Release.
func (c *Files) OpenHandles(id lockmgr.LockID) int {
	c.mu.Lock()
	var nodes []*controlNode
	for _, n := range c.nodes {
		nodes = append(nodes, n)
	}
	c.mu.Unlock()
	open := 0
	for _, n := range nodes {
		if n.lockID() == id {
			n.mu.Lock()
			open += int(n.open)
			n.mu.Unlock()
		}
	}
	return open
}
