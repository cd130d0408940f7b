// Package fusermount unmounts FUSE mounts with fusermount3(1), the setuid
// helper that lets a user who is not root unmount what they mounted.
package fusermount

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// InstallHint is what to tell a user who lacks fusermount3 or /dev/fuse.
const InstallHint = "install it with `apt-get install -y fuse3`"

// timeout bounds one fusermount3 run: unmounting a mount whose
// daemon hangs must not hang us too.
const timeout = 30 * time.Second

var (
	// ErrBusy: the mount has open files (lock waiters included).
	ErrBusy = errors.New("mount is busy")
	// ErrNotMounted: nothing is mounted there.
	ErrNotMounted = errors.New("not mounted")
)

// Unmount unmounts mountpoint with fusermount3 -u, or -uz when lazy (a
// lazy unmount detaches the mount now; it goes away when the last file open
// there is closed). Errors wrap ErrBusy or ErrNotMounted when they mean that.
func Unmount(mountpoint string, lazy bool) error {
	path, err := exec.LookPath("fusermount3")
	if err != nil {
		return fmt.Errorf("fusermount3 not found in $PATH: %s", InstallHint)
	}
	flag := "-u"
	if lazy {
		flag = "-uz"
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
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
		return fmt.Errorf("fusermount3 %s: %s: %w", flag, msg, ErrBusy)
	case strings.Contains(msg, "not found in /etc/mtab"), strings.Contains(msg, "Invalid argument"),
		strings.Contains(msg, "not mounted"):
		return fmt.Errorf("fusermount3 %s: %s: %w", flag, msg, ErrNotMounted)
	}
	return fmt.Errorf("fusermount3 %s: %s", flag, msg)
}

// BusyLazy unmounts mountpoint, lazily if it is busy. lazy reports
// whether the lazy path was taken.
func BusyLazy(mountpoint string) (lazy bool, err error) {
	err = Unmount(mountpoint, false)
	if !errors.Is(err, ErrBusy) {
		return false, err
	}
	return true, Unmount(mountpoint, true)
}
