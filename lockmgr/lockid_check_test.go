package lockmgr

import (
	"errors"
	"testing"
)

// TestLockIDCheck: the ids the engine hands a backend pass; a path not in
// CleanPath's form or an unknown kind is ErrInvalid.
func TestLockIDCheck(t *testing.T) {
	for _, id := range []LockID{{".", KindDir}, {"a/b", KindNewDir}, {"a", KindUsage}} {
		if err := id.Check(); err != nil {
			t.Errorf("%+v: %v, want nil", id, err)
		}
	}
	for _, id := range []LockID{{"", KindDir}, {"/a", KindDir}, {"a/", KindDir}, {"a/./b", KindDir},
		{"a/../b", KindDir}, {"a//b", KindDir}, {"a", Kind(99)}} {
		if err := id.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", id, err)
		}
	}
}
