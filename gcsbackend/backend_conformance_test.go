package gcsbackend_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/lockmgr"
	"github.com/lockfs/lockfs/lockmgr/backendtest"
)

// TestBackendConformance runs the Backend conformance suite against two gcs
// backends (two hosts) on one emulator bucket.
func TestBackendConformance(t *testing.T) {
	emu := gcstest.Start(t)
	backendtest.Run(t, func(t *testing.T) (lockmgr.Backend, lockmgr.Backend) {
		var pair [2]lockmgr.Backend
		for i := range pair {
			b, err := gcsbackend.New(context.Background(), gcsbackend.Config{
				Bucket:   emu.Bucket,
				Prefix:   "test/" + t.Name(),
				Endpoint: emu.Endpoint(),
				TTL:      testTTL,
				HostID:   fmt.Sprintf("host%d", hostSeq.Add(1)),
				Logger:   testLogger(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			pair[i] = b
		}
		return pair[0], pair[1]
	})
}
