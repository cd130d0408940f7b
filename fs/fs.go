// Package fs is lockfs's FUSE layer: a passthrough of SOURCE plus the
// control files (.lock, .lock_newdir, .lock_usage) in every directory, whose
// flock(2) and fcntl(2) requests it maps to the lock engine.
package fs

import (
	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/lockmgr"
)

// Config is what a mount needs.
type Config struct {
	// Source is the absolute path of the directory tree to pass through.
	Source string
	// Engine arbitrates the directory locks. Required.
	Engine *lockmgr.Engine
	// Logger receives one line per refused request and per error; nil discards.
	Logger logrus.FieldLogger
	// Host names this daemon in status output; default: the hostname.
	Host string
}

// Reserved names. The control files appear in every directory; the backing
// files of the local backend are never visible through the mount.
var (
	controlNames = map[string]lockmgr.Kind{
		".lock":        lockmgr.KindDir,
		".lock_newdir": lockmgr.KindNewDir,
		".lock_usage":  lockmgr.KindUsage,
	}
	backingNames = map[string]bool{
		"..LOCK":        true,
		"..LOCK_NEWDIR": true,
		"..LOCK_USAGE":  true,
	}
)

// controlKind reports whether name is a control file, and which lock it takes.
func controlKind(name string) (lockmgr.Kind, bool) {
	k, ok := controlNames[name]
	return k, ok
}

// isReserved reports whether name may not be created, removed or renamed
// through the mount: a control file or a backing file.
func isReserved(name string) bool {
	_, ok := controlNames[name]
	return ok || backingNames[name]
}
