package lockmgr

// SourceNamer is implemented by backends that keep files of their own in the
// directories of SOURCE (the local backend's ..LOCK, ..LOCK_NEWDIR and
// ..LOCK_USAGE). The mount hides those names and refuses to create them.
type SourceNamer interface {
	// SourceNames returns the names of the backend's files, the same in
	// every directory.
	SourceNames() []string
}

// SourceNames returns the names the engine's backend keeps in the
// directories of SOURCE, nil if it keeps none there.
func (e *Engine) SourceNames() []string {
	if sn, ok := e.backend.(SourceNamer); ok {
		return sn.SourceNames()
	}
	return nil
}
