package fuse

import (
	"errors"
	"syscall"
	"testing"
)

// TestConnGone: the two errnos with which a read of /dev/fuse says the
// connection is over end Serve quietly; any other error is still an
// error. ECONNABORTED was the one missing: an unmount that raced with a
// read holding a request made Serve fail with "software caused connection
// abort" (lockfs TestOpenCapPerUserControl, where a killed process's
// RELEASEs are in flight at unmount).
func TestConnGone(t *testing.T) {
	for _, c := range []struct {
		err  error
		gone bool
	}{
		{syscall.ENODEV, true},
		{syscall.ECONNABORTED, true},
		{nil, false},
		{syscall.EINTR, false},
		{syscall.EIO, false},
		{errors.New("other"), false},
	} {
		if got := connGone(c.err); got != c.gone {
			t.Errorf("connGone(%v) = %v, want %v", c.err, got, c.gone)
		}
	}
}
