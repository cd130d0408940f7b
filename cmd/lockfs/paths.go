package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/fusermount"
	"github.com/lockfs/lockfs/localbackend"
)

// mountPaths are SOURCE and MOUNTPOINT, absolute with symlinks resolved.
type mountPaths struct {
	source     string
	mountpoint string
}

// preparePaths checks SOURCE and MOUNTPOINT before anything is mounted, and
// cleans up a stale mount at MOUNTPOINT. Every refusal says why.
func preparePaths(source, mountpoint string, allowRemote bool, log logrus.FieldLogger) (mountPaths, error) {
	src, err := existingDir("SOURCE", source)
	if err != nil {
		return mountPaths{}, err
	}
	if err := cleanStaleMount(mountpoint, log); err != nil {
		return mountPaths{}, err
	}
	return checkPaths(src, mountpoint, allowRemote, log)
}

// checkPaths checks MOUNTPOINT against SOURCE (src, already resolved by
// existingDir) and SOURCE's filesystem; it changes nothing, so that lockfs
// doctor can run it too.
func checkPaths(src, mountpoint string, allowRemote bool, log logrus.FieldLogger) (mountPaths, error) {
	mnt, err := existingDir("MOUNTPOINT", mountpoint)
	if err != nil {
		return mountPaths{}, err
	}
	// By device and inode, not by path: through a bind mount of SOURCE,
	// MOUNTPOINT can lie inside it under an unrelated path.
	if in, err := insideDir(mnt, src); err != nil {
		return mountPaths{}, err
	} else if in {
		return mountPaths{}, fmt.Errorf("MOUNTPOINT %s is inside SOURCE %s, or is SOURCE itself (compared by device and inode, so through a bind mount too): "+
			"the mount would contain itself; choose a mountpoint outside SOURCE", mnt, src)
	}
	if in, err := insideDir(src, mnt); err != nil {
		return mountPaths{}, err
	} else if in {
		return mountPaths{}, fmt.Errorf("SOURCE %s is inside MOUNTPOINT %s (compared by device and inode, so through a bind mount too): "+
			"the mount would hide its own source; choose a mountpoint outside SOURCE", src, mnt)
	}
	name, err := localbackend.ForeignFilesystem(src)
	if err != nil {
		return mountPaths{}, fmt.Errorf("SOURCE %s: %w", src, err)
	}
	if name != "" {
		if !allowRemote {
			return mountPaths{}, fmt.Errorf("SOURCE %s is on %s: its flock is not this host's "+
				"lock table, so the local backend could not keep its promises there. "+
				"Pass --allow-remote-source if every process that locks it runs on this host", src, strings.ToUpper(name))
		}
		log.WithFields(logrus.Fields{"source": src, "fstype": name}).
			Warn("SOURCE is on a remote or FUSE filesystem (--allow-remote-source): locks are only as good as its flock")
	}
	return mountPaths{source: src, mountpoint: mnt}, nil
}

// existingDir returns path absolute with symlinks resolved, or an error
// naming what (SOURCE, MOUNTPOINT) is wrong with it.
func existingDir(what, path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("%s %q: %w", what, path, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%s %s does not exist: create the directory first", what, abs)
	}
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, abs, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, abs, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s %s is not a directory", what, abs)
	}
	return real, nil
}

// insideDir reports whether path is dir, or lies beneath it, comparing
// devices and inodes walking up from path to the root: a bind mount of dir
// elsewhere shows the same directory under another path. Both paths are
// absolute with symlinks resolved.
func insideDir(path, dir string) (bool, error) {
	var d unix.Stat_t
	if err := unix.Stat(dir, &d); err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	for p := path; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return false, fmt.Errorf("stat %s: %w", p, err)
		}
		if st.Dev == d.Dev && st.Ino == d.Ino {
			return true, nil
		}
		if p == "/" {
			return false, nil
		}
	}
}

// within reports whether path is dir or lies beneath it. Both are clean
// absolute paths.
func within(path, dir string) bool {
	if path == dir || dir == "/" {
		return true
	}
	return strings.HasPrefix(path, dir+"/")
}

// probeTimeout bounds the statfs that tells a live FUSE mount from a stale
// one: a hung daemon must not hang us.
const probeTimeout = 5 * time.Second

// cleanStaleMount removes the mount a killed daemon left at mountpoint, and
// refuses a live FUSE mount there. A stale mount answers statfs with ENOTCONN
// ("Transport endpoint is not connected"); stat alone is not enough, since the
// kernel may answer it from its attribute cache.
func cleanStaleMount(mountpoint string, log logrus.FieldLogger) error {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return err
	}
	// The mount table has real paths. Resolve the parent only: the
	// mountpoint itself may be stale and fail every lookup.
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		abs = filepath.Join(dir, filepath.Base(abs))
	}
	ms, err := mountsAt(abs)
	if err != nil {
		return err
	}
	var probe error
	if n := len(ms); n > 0 && ms[n-1].isFUSE() {
		probe = statfsWithin(abs, probeTimeout)
		switch {
		case probe == nil:
			return fmt.Errorf("MOUNTPOINT %s is already a FUSE mount (%s from %s): "+
				"is another lockfs running there? Stop it, or run `lockfs unmount %s`", abs, ms[n-1].Type, ms[n-1].Source, abs)
		case errors.Is(probe, errProbeTimeout):
			return fmt.Errorf("MOUNTPOINT %s is a FUSE mount (%s from %s) whose daemon does not answer: "+
				"run `lockfs unmount %s` (or fusermount3 -uz %s) first", abs, ms[n-1].Type, ms[n-1].Source, abs, abs)
		}
	} else {
		// Not in our mount table (another mount namespace?): stat still
		// tells a stale mount.
		var st unix.Stat_t
		probe = unix.Stat(abs, &st)
	}
	if !errors.Is(probe, unix.ENOTCONN) && !errors.Is(probe, unix.ECONNABORTED) {
		return nil // other errors are reported by existingDir
	}
	log.WithField("mountpoint", abs).
		Warn("MOUNTPOINT has a stale mount (transport endpoint is not connected): cleaning it up with fusermount3 -uz")
	if err := fusermount.Unmount(abs, true); err != nil && !errors.Is(err, fusermount.ErrNotMounted) {
		return fmt.Errorf("cleaning up the stale mount at %s: %w", abs, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(abs, &st); err != nil {
		return fmt.Errorf("MOUNTPOINT %s is still unusable after removing the stale mount: %w", abs, err)
	}
	log.WithField("mountpoint", abs).Info("stale mount removed")
	return nil
}

// errProbeTimeout: statfs did not return in time.
var errProbeTimeout = errors.New("no answer")

// statfsWithin runs statfs(2) on path, giving up after timeout. statfs is
// never answered from a cache, so it reaches a FUSE daemon.
func statfsWithin(path string, timeout time.Duration) error {
	done := make(chan error, 1)
	// If the daemon hangs, this goroutine stays blocked until it answers or
	// the process exits; lockfs then exits with an error anyway.
	go func() {
		var st unix.Statfs_t
		done <- unix.Statfs(path, &st)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return errProbeTimeout
	}
}
