package lockmgr

import (
	"errors"
	"strings"
)

// ErrBusy means that a lock on a directory, or on something below it, is
// held: the directory may not be renamed (a lock is the lock of its
// directory's current path, so moving a held lock would hand it to whoever
// takes the path next).
var ErrBusy = errors.New("a lock on the directory or below it is held")

// TreeGuard is implemented by backends that can tell whether anyone on the
// host holds a claim on a directory or below it, and hold new claims off
// meanwhile (the local backend: every claim at or below a directory holds
// the directory's backing file shared, so an exclusive flock on it without
// waiting answers both).
type TreeGuard interface {
	// GuardTree fails with an error wrapping ErrBusy if a claim on dir or
	// below it is held, by this daemon, another one or a program locking
	// SOURCE directly. Otherwise no such claim is granted until release is
	// called, which undoes whatever GuardTree changed in SOURCE.
	GuardTree(dir string) (release func(), err error)
}

// GuardTree is for renaming the directory dir (a clean path, not "."): it
// fails with an error wrapping ErrBusy if any lock at dir or below it is
// held through this engine or, where the backend can tell (TreeGuard), by
// anyone else; otherwise it holds off new grants there, where the backend
// can, until release is called. Without a TreeGuard backend (gcs), a lock
// held by another host does not make it fail, and a grant made here while
// the rename runs is not held off.
func (e *Engine) GuardTree(dir string) (release func(), err error) {
	release = func() {}
	if g, ok := e.backend.(TreeGuard); ok {
		if release, err = g.GuardTree(dir); err != nil {
			return nil, err
		}
	}
	if held := e.heldAtOrBelow(dir); held != "" {
		release()
		return nil, &busyError{dir: dir, held: held}
	}
	return release, nil
}

// heldAtOrBelow returns the path of a lock at dir or below it that is held
// through this engine, "" if none.
func (e *Engine) heldAtOrBelow(dir string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, ls := range e.locks {
		if ls.holds.len() == 0 {
			continue
		}
		if dir == "." || id.Path == dir || strings.HasPrefix(id.Path, dir+"/") {
			return id.String()
		}
	}
	return ""
}

// busyError names the held lock that makes a directory busy.
type busyError struct{ dir, held string }

func (b *busyError) Error() string {
	return "rename " + b.dir + ": " + b.held + " is held"
}

func (b *busyError) Unwrap() error { return ErrBusy }

// KeptDropper is implemented by backends that keep a released claim for a
// moment (the local backend keeps shared flocks for a few milliseconds, so
// that the next claim needs no system call). Such a claim is no hold, but
// it is still a flock on the backing file: DropKept gives every one up at
// once, for callers that are about to test the backing files' flocks
// themselves (rmdir through the mount).
type KeptDropper interface {
	DropKept()
}

// DropKeptClaims makes the backend give up the claims it kept after their
// release, if it keeps any (KeptDropper).
func (e *Engine) DropKeptClaims() {
	if d, ok := e.backend.(KeptDropper); ok {
		d.DropKept()
	}
}
