package testutil

import "context"

// Done reports whether c has ended, without waiting.
func Done(c context.Context) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}
