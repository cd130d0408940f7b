package fs

// SetPerRequest makes s serve each request on a goroutine of its own, as
// upstream did: the control of the reader tests (readers_test.go).
func SetPerRequest(s *Server) { s.perRequest = true }
