package etcdbackend

// Crash stops the backend as a killed daemon stops: no revocation, no
// more keep-alives; its keys stay until the server expires its lease.
func (b *Backend) Crash() {
	b.shutdown()
	b.cli.Close()
}

// NoHierarchy makes claims check the lock's own keys only (test hook).
func (b *Backend) NoHierarchy() { b.noHierarchy = true }
