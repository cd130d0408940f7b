package fs

// SetPerRequest makes s serve each request on a goroutine of its own, as
// upstream did: the control of the reader tests (readers_test.go).
func SetPerRequest(s *Server) { s.perRequest = true }

// NodeRefSizes returns how many entries s's map from nodes to node IDs
// holds, and the most it held since it was last made anew.
func NodeRefSizes(s *Server) (n, peak int) {
	s.meta.Lock()
	defer s.meta.Unlock()
	return len(s.nodeRef), s.nodeRefPeak
}
