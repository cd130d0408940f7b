package lockmgr

import (
	"fmt"
	"path"
	"strings"
)

// Kind says which of a directory's three locks a request is about.
type Kind uint8

const (
	// KindDir is the directory lock, taken through the control file ".lock".
	KindDir Kind = iota + 1
	// KindNewDir is the new-subdirectory lock, taken through ".lock_newdir".
	KindNewDir
	// KindUsage is the usage lock, taken through ".lock_usage". It is exclusive only.
	KindUsage
)

// String returns the kind's short name as status output and logs spell it.
func (k Kind) String() string {
	switch k {
	case KindDir:
		return "dir"
	case KindNewDir:
		return "newdir"
	case KindUsage:
		return "usage"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// ParseKind is the inverse of Kind.String.
func ParseKind(s string) (Kind, error) {
	switch s {
	case "dir":
		return KindDir, nil
	case "newdir":
		return KindNewDir, nil
	case "usage":
		return KindUsage, nil
	}
	return 0, fmt.Errorf("unknown lock kind %q (want dir, newdir or usage)", s)
}

// Mode is how a lock is held. The zero value means "not held".
type Mode uint8

const (
	// Shared is compatible with other shared holds.
	Shared Mode = iota + 1
	// Exclusive conflicts with every other hold.
	Exclusive
)

// String returns "shared", "exclusive" or "none".
func (m Mode) String() string {
	switch m {
	case 0:
		return "none"
	case Shared:
		return "shared"
	case Exclusive:
		return "exclusive"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode is the inverse of Mode.String for a held mode: "shared" or
// "exclusive".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "shared":
		return Shared, nil
	case "exclusive":
		return Exclusive, nil
	}
	return 0, fmt.Errorf("unknown lock mode %q (want shared or exclusive)", s)
}

// Conflicts is the protocol's one conflict rule: shared is compatible with
// shared, exclusive conflicts with everything, and "not held" with nothing.
// It is symmetric.
func Conflicts(a, b Mode) bool {
	if a == 0 || b == 0 {
		return false
	}
	return a == Exclusive || b == Exclusive
}

// maxMode returns the stronger of two modes.
func maxMode(a, b Mode) Mode {
	if a > b {
		return a
	}
	return b
}

// LockID names one lock: a directory, relative to the mount root, and a kind.
// The root directory is ".". Paths are slash-separated and clean.
type LockID struct {
	Path string
	Kind Kind
}

// String renders the lock as the control file that takes it, e.g. "a/b/.lock".
func (id LockID) String() string {
	return path.Join(id.Path, ControlName(id.Kind))
}

// ControlName returns the name of the control file for a kind.
func ControlName(k Kind) string {
	switch k {
	case KindNewDir:
		return ".lock_newdir"
	case KindUsage:
		return ".lock_usage"
	}
	return ".lock"
}

// ControlKind is the inverse of ControlName: the kind of the lock that the
// control file name takes, and false if name is not a control file.
func ControlKind(name string) (Kind, bool) {
	switch name {
	case ".lock":
		return KindDir, true
	case ".lock_newdir":
		return KindNewDir, true
	case ".lock_usage":
		return KindUsage, true
	}
	return 0, false
}

// CleanPath normalises a directory path relative to the mount root: slash
// separated, no leading slash, no "." elements, "." for the root. It rejects
// paths with ".." elements.
func CleanPath(p string) (string, error) {
	if isClean(p) {
		return p, nil
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", fmt.Errorf("path %q contains ..", p)
		}
	}
	c := strings.TrimPrefix(path.Clean("/"+p), "/")
	if c == "" {
		c = "."
	}
	return c, nil
}

// isClean reports whether p is already in CleanPath's form, without
// allocating: "." or slash-separated non-empty elements other than "." and "..".
func isClean(p string) bool {
	if p == "." {
		return true
	}
	if p == "" || p[0] == '/' || p[len(p)-1] == '/' {
		return false
	}
	start := 0
	for i := 0; i <= len(p); i++ {
		if i == len(p) || p[i] == '/' {
			el := p[start:i]
			if el == "" || el == "." || el == ".." {
				return false
			}
			start = i + 1
		}
	}
	return true
}

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

// Owner identifies who holds a lock in the kernel's sense. Holds of one owner
// never conflict with each other: a second request by the same owner is a
// conversion. The caller chooses the ID space per class.
type Owner struct {
	Class OwnerClass
	ID    uint64
}

// OwnerClass says which kernel lock family an owner follows.
type OwnerClass uint8

const (
	// OwnerFile is an open file description: flock(2) and OFD locks. A
	// conversion from shared to exclusive that cannot be granted at once
	// releases the shared hold, then waits, as flock(2) documents.
	OwnerFile OwnerClass = iota + 1
	// OwnerPOSIX is a process's POSIX record-lock owner (fcntl F_SETLK,
	// lockf). Conversions are atomic: the shared hold is kept while waiting,
	// and two processes upgrading at once get ErrDeadlock, as with fcntl.
	OwnerPOSIX
)

// String names the class.
func (c OwnerClass) String() string {
	switch c {
	case OwnerFile:
		return "file"
	case OwnerPOSIX:
		return "posix"
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// String renders an owner for logs.
func (o Owner) String() string { return fmt.Sprintf("%s:%x", o.Class, o.ID) }
