package lockmgr

import "fmt"

// Check reports whether id is one the engine hands a Backend: a known
// kind and a path already in CleanPath's form. Its error wraps
// ErrInvalid. Every backend checks the ids it is given with it.
func (id LockID) Check() error {
	switch id.Kind {
	case KindDir, KindNewDir, KindUsage:
	default:
		return fmt.Errorf("%w: lock kind %v", ErrInvalid, id.Kind)
	}
	if !isClean(id.Path) {
		return fmt.Errorf("%w: path %q is not a clean relative path", ErrInvalid, id.Path)
	}
	return nil
}
