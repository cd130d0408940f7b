package gcsbackend

import "testing"

// The lock names in want metadata read back as the locks they name, the
// root's included.
func TestParseLockIDRoot(t *testing.T) {
	for _, s := range []string{".lock", ".lock_newdir", "a/.lock", "a/b/.lock_usage"} {
		id, err := parseLockID(s)
		if err != nil || id.String() != s {
			t.Errorf("%q: %v %v", s, id, err)
		}
	}
}
