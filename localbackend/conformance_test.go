package localbackend

import (
	"testing"

	"github.com/lockfs/lockfs/lockmgr"
	"github.com/lockfs/lockfs/lockmgr/backendtest"
)

// TestConformance runs the Backend conformance suite against two local
// backends over one SOURCE, as two daemons on one host see it.
func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) (lockmgr.Backend, lockmgr.Backend) {
		src := newSource(t, "a", "b")
		var pair [2]lockmgr.Backend
		for i := range pair {
			b, err := New(Config{Source: src})
			if err != nil {
				t.Fatal(err)
			}
			pair[i] = b
		}
		return pair[0], pair[1]
	})
}
