//go:build !linux

package fuse

// Splice replies are Linux's; elsewhere ReadResponse.Splice is answered
// through Data.

// SpliceReadMax returns 0: no read is answered by splice here.
func SpliceReadMax() int { return 0 }

type pipePool struct{}

func (pp *pipePool) closeAll() {}

func (c *Conn) spliceReply(unique uint64, off int64, fd int, size int) bool { return false }
