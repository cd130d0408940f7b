package fs

import (
	"runtime/debug"
	"time"
)

// Memory of forgotten inodes.
//
// A tree walk makes the kernel look up every name, and the daemon keeps a
// node per inode until the kernel forgets it (FORGET, after drop_caches or
// memory pressure). The nodes themselves are then garbage, but the Go
// runtime returns freed pages to the system only slowly, and a Go map keeps
// its buckets at their peak size: measured, the daemon stayed at about 90
// MB RSS after the kernel forgot a 50,000-file tree. So once forgetBatch
// nodes have been forgotten, and releaseDelay after the last of a burst of
// FORGETs, the daemon copies its node table into a map of the right size
// and hands the free memory back (debug.FreeOSMemory: one collection, on
// a heap that has just shrunk).

const (
	// forgetBatch is how many forgotten nodes trigger a release.
	forgetBatch = 4096
	// releaseDelay is how long a release waits for the burst of FORGETs
	// to end: a walk's FORGETs come in one burst.
	releaseDelay = time.Second
)

// noteForget counts a forgotten node and schedules a release after every
// forgetBatch of them.
func (f *FS) noteForget() {
	if f.forgotten.Add(1)%forgetBatch != 0 {
		return
	}
	f.releaseMu.Lock()
	defer f.releaseMu.Unlock()
	if f.closed.Load() {
		return
	}
	if f.release == nil {
		f.release = time.AfterFunc(releaseDelay, f.releaseMemory)
		return
	}
	f.release.Reset(releaseDelay)
}

// releaseMemory shrinks the node table and returns free memory to the
// system.
func (f *FS) releaseMemory() {
	f.nodesMu.Lock()
	nodes := make(map[inodeKey]passNode, len(f.nodes))
	for k, n := range f.nodes {
		nodes[k] = n
	}
	f.nodes = nodes
	f.nodesMu.Unlock()
	debug.FreeOSMemory()
}

// stopRelease stops a scheduled release (Close).
func (f *FS) stopRelease() {
	f.releaseMu.Lock()
	defer f.releaseMu.Unlock()
	if f.release != nil {
		f.release.Stop()
	}
}
