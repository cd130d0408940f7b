package lockmgr_test

import (
	"testing"

	"github.com/lockfs/lockfs/lockmgr"
	"github.com/lockfs/lockfs/lockmgr/backendtest"
)

// TestMemBackendConformance proves that the in-memory fake every engine
// test runs on keeps the Backend contract, as localbackend and gcsbackend
// do (their tests run the same suite).
func TestMemBackendConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) (lockmgr.Backend, lockmgr.Backend) {
		return lockmgr.NewMemBackendPair()
	})
}
