package lockmgr

// NewMemBackendPair returns two in-memory fake backends over one host
// table, for the conformance suite (backend_conformance_test.go).
func NewMemBackendPair() (Backend, Backend) {
	h := newMemHost()
	return &memBackend{host: h}, &memBackend{host: h}
}
