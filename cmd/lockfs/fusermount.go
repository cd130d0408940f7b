package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// installFUSE is what to tell a user who lacks fusermount3 or /dev/fuse.
const installFUSE = "install it with `apt-get install -y fuse3`"

// fusermountTimeout bounds one fusermount3 run: unmounting a mount whose
// daemon hangs must not hang us too.
const fusermountTimeout = 30 * time.Second

var (
	// errBusy: the mount has open files (lock waiters included).
	errBusy = errors.New("mount is busy")
	// errNotMounted: nothing is mounted there.
	errNotMounted = errors.New("not mounted")
)

// fusermount unmounts mountpoint with fusermount3 -u, or -uz when lazy (a
// lazy unmount detaches the mount now; it goes away when the last file open
// there is closed). Errors wrap errBusy or errNotMounted when they mean that.
func fusermount(mountpoint string, lazy bool) error {
	path, err := exec.LookPath("fusermount3")
	if err != nil {
		return fmt.Errorf("fusermount3 not found in $PATH: %s", installFUSE)
	}
	flag := "-u"
	if lazy {
		flag = "-uz"
	}
	ctx, cancel := context.WithTimeout(context.Background(), fusermountTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, flag, mountpoint).CombinedOutput()
	if err == nil {
		return nil
	}
	msg := string(bytes.TrimSpace(out))
	if msg == "" {
		msg = err.Error()
	}
	switch {
	case strings.Contains(msg, "busy"):
		return fmt.Errorf("fusermount3 %s: %s: %w", flag, msg, errBusy)
	case strings.Contains(msg, "not found in /etc/mtab"), strings.Contains(msg, "Invalid argument"),
		strings.Contains(msg, "not mounted"):
		return fmt.Errorf("fusermount3 %s: %s: %w", flag, msg, errNotMounted)
	}
	return fmt.Errorf("fusermount3 %s: %s", flag, msg)
}

// unmountBusyLazy unmounts mountpoint, lazily if it is busy. lazy reports
// whether the lazy path was taken.
func unmountBusyLazy(mountpoint string) (lazy bool, err error) {
	err = fusermount(mountpoint, false)
	if !errors.Is(err, errBusy) {
		return false, err
	}
	return true, fusermount(mountpoint, true)
}
