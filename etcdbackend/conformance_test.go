package etcdbackend_test

import (
	"testing"

	"github.com/lockfs/lockfs/etcdbackend/etcdtest"
	"github.com/lockfs/lockfs/lockmgr"
	"github.com/lockfs/lockfs/lockmgr/backendtest"
)

// TestBackendConformance runs the Backend conformance suite against two
// etcd backends (two hosts) on one etcd server.
func TestBackendConformance(t *testing.T) {
	c := etcdtest.Start(t)
	backendtest.Run(t, func(t *testing.T) (lockmgr.Backend, lockmgr.Backend) {
		a, b := newBackend(t, c), newBackend(t, c)
		return a, b
	})
}
