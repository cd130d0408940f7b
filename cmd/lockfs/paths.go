package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// remoteFS names the filesystems, by statfs magic, whose flock(2) is not this
// host's kernel lock table: the local backend must not keep its locks there.
var remoteFS = map[int64]string{
	0x6969:     "NFS",
	0x517B:     "SMB",
	0xFF534D42: "CIFS",
	0xFE534D42: "SMB2",
	0x65735546: "FUSE",
}

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
	mnt, err := existingDir("MOUNTPOINT", mountpoint)
	if err != nil {
		return mountPaths{}, err
	}
	if ms, err := mountsAt(mnt); err != nil {
		return mountPaths{}, err
	} else if n := len(ms); n > 0 && ms[n-1].isFUSE() {
		return mountPaths{}, fmt.Errorf("MOUNTPOINT %s is already a FUSE mount (%s from %s): "+
			"is another lockfs running there? Stop it, or run `lockfs unmount %s`", mnt, ms[n-1].Type, ms[n-1].Source, mnt)
	}
	if within(mnt, src) {
		return mountPaths{}, fmt.Errorf("MOUNTPOINT %s is inside SOURCE %s (or is it): "+
			"the mount would contain itself; choose a mountpoint outside SOURCE", mnt, src)
	}
	if within(src, mnt) {
		return mountPaths{}, fmt.Errorf("SOURCE %s is inside MOUNTPOINT %s: "+
			"the mount would hide its own source; choose a mountpoint outside SOURCE", src, mnt)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(src, &st); err != nil {
		return mountPaths{}, fmt.Errorf("statfs SOURCE %s: %w", src, err)
	}
	if name, ok := remoteFS[int64(st.Type)]; ok {
		if !allowRemote {
			return mountPaths{}, fmt.Errorf("SOURCE %s is on %s (statfs type %#x): its flock is not this host's "+
				"lock table, so the local backend could not keep its promises there. "+
				"Pass --allow-remote-source if every process that locks it runs on this host", src, name, st.Type)
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

// within reports whether path is dir or lies beneath it. Both are clean
// absolute paths.
func within(path, dir string) bool {
	if path == dir || dir == "/" {
		return true
	}
	return strings.HasPrefix(path, dir+"/")
}

// cleanStaleMount removes the mount a killed daemon left at mountpoint: its
// stat fails with ENOTCONN ("Transport endpoint is not connected").
func cleanStaleMount(mountpoint string, log logrus.FieldLogger) error {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	err = unix.Stat(abs, &st)
	if !errors.Is(err, unix.ENOTCONN) && !errors.Is(err, unix.ECONNABORTED) {
		return nil // the other errors are reported by existingDir
	}
	log.WithField("mountpoint", abs).
		Warn("MOUNTPOINT has a stale mount (transport endpoint is not connected): cleaning it up with fusermount3 -uz")
	if err := fusermount(abs, true); err != nil && !errors.Is(err, errNotMounted) {
		return fmt.Errorf("cleaning up the stale mount at %s: %w", abs, err)
	}
	if err := unix.Stat(abs, &st); err != nil {
		return fmt.Errorf("MOUNTPOINT %s is still unusable after removing the stale mount: %w", abs, err)
	}
	log.WithField("mountpoint", abs).Info("stale mount removed")
	return nil
}
