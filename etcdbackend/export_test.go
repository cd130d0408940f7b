package etcdbackend

// Crash stops the backend as a killed daemon stops: no revocation, no
// more keep-alives; its keys stay until the server expires its lease.
func (b *Backend) Crash() {
	b.shutdown()
	b.cli.Close()
}

// NoHierarchy makes claims check the lock's own keys only (test hook).
func (b *Backend) NoHierarchy() { b.noHierarchy = true }

// SessionLease returns the etcd lease id of the live session, 0 if none.
func (b *Backend) SessionLease() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sess == nil {
		return 0
	}
	return int64(b.sess.id)
}

// NoApplyDeletes makes a woken claim read again before its transaction
// (test hook).
func (b *Backend) NoApplyDeletes() { b.noApplyDeletes = true }

// PerLockWants makes claims see their own lock's wants only (test hook).
func (b *Backend) PerLockWants() { b.perLockWants = true }

// WholeTreeWants makes exclusive directory claims see the wants inside the
// directory, and claims without wait refused by any earlier want (test
// hook: the reverted rule).
func (b *Backend) WholeTreeWants() { b.wholeTreeWants = true }
