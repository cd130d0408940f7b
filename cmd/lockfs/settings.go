package main

import (
	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// settingsInEffect are the settings a mount runs with, defaults filled in,
// for the start-up log: what the flags left unsaid is what an operator
// most needs to see there (the lease TTL, the open-file cap).
func settingsInEffect(mf mountFlags, backend lockmgr.Backend, maxOpen int) logrus.Fields {
	f := logrus.Fields{
		"passthrough":      mf.passthrough,
		"readdirplus":      mf.readdirplus,
		"splice_reads":     mf.spliceReads,
		"readahead_kb":     mf.readaheadKB,
		"allow_other":      mf.allowOther,
		"log_wait_over":    mf.slowWait.String(),
		"max_open_per_uid": maxOpen,
	}
	switch b := backend.(type) {
	case *gcsbackend.Backend:
		c := b.Config()
		f["lease_ttl"], f["refresh_every"], f["request_timeout"] = c.TTL.String(), c.RefreshInterval.String(), c.RequestTimeout.String()
	case *localbackend.Backend:
		f["keep_shared_locks"] = mf.keepShared.String()
	}
	return f
}
