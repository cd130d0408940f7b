package localbackend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"
)

// Config configures a local Backend. The zero value of every field but
// Source is a usable default.
type Config struct {
	// Source is the SOURCE directory of the mount: the tree whose
	// directories carry the ..LOCK backing files. It is required and must be
	// an existing directory.
	Source string

	// Logger receives the backend's log lines, with fields. Nil discards them.
	Logger logrus.FieldLogger

	// FlockPath is the flock(1) program (util-linux) that a waiting Claim
	// runs to wait in the kernel on the backend's behalf; see the package
	// documentation. Empty means the "flock" found in $PATH when New runs.
	FlockPath string

	// AllowNetworkFS lets Source live on a filesystem whose flock(2) is not
	// this host's kernel lock table (NFS, CIFS/SMB, FUSE, 9p, Ceph, AFS...).
	// There, locks might not exclude other hosts' processes as the local
	// backend promises, so New refuses such a Source unless this is set.
	AllowNetworkFS bool

	// SyncTokens makes NextToken fdatasync the backing file after every
	// increment, so that fencing tokens keep increasing even across a host
	// crash or power loss. Without it they survive daemon restarts (the
	// page cache does) but a host crash may roll back the last increments.
	// It costs one disk flush per token.
	SyncTokens bool

	// KeepShared is how long a released shared claim keeps its flock so
	// that the next shared claim of the same lock needs no system call
	// (keep.go): the longest a program locking SOURCE directly, or another
	// daemon, waits for it beyond the real holds. Zero means the default,
	// 5 ms; a negative value disables the keep. At most MaxKeepShared.
	KeepShared time.Duration
}

// DefaultKeepShared and MaxKeepShared are Config.KeepShared's default and
// upper bound.
const (
	DefaultKeepShared = 5 * time.Millisecond
	MaxKeepShared     = time.Minute
)

// Validate checks the configuration without changing it: Source must name an
// existing directory, and FlockPath, when set, an executable file.
func (c Config) Validate() error {
	if c.Source == "" {
		return errors.New("localbackend: Source is required")
	}
	fi, err := os.Stat(c.Source)
	if err != nil {
		return fmt.Errorf("localbackend: source: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("localbackend: source %q is not a directory", c.Source)
	}
	if c.KeepShared > MaxKeepShared {
		return fmt.Errorf("localbackend: KeepShared %v is longer than %v", c.KeepShared, MaxKeepShared)
	}
	if c.FlockPath != "" {
		if !filepath.IsAbs(c.FlockPath) {
			return fmt.Errorf("localbackend: FlockPath %q must be absolute", c.FlockPath)
		}
		fi, err := os.Stat(c.FlockPath)
		if err != nil {
			return fmt.Errorf("localbackend: flock(1): %w", err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("localbackend: FlockPath %q is not an executable file", c.FlockPath)
		}
	}
	return nil
}
