package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/lockfs/lockfs/internal/fusermount"
	"github.com/spf13/cobra"
)

const unmountLong = `Unmount the lockfs mount at MOUNTPOINT with fusermount3 -u. If the mount is
busy (a process has a file or a lock open there), it is detached lazily
(fusermount3 -uz): it disappears from the namespace now and goes away when the
last open file there is closed. The lockfs daemon serving it then stops,
releasing every lock. A stale mount left by a killed daemon ("Transport
endpoint is not connected") is removed the same way.

Stopping the daemon with Ctrl-C or SIGTERM does the same.`

func newUnmountCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "unmount MOUNTPOINT",
		Aliases: []string{"umount"},
		Short:   "Unmount a lockfs mount (lazily if busy)",
		Long:    unmountLong,
		Args:    exactArgs(1, "exactly one argument, MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runUnmount(args[0], cmd.OutOrStdout())
		},
	}
}

func runUnmount(mountpoint string, stdout io.Writer) error {
	if err := checkFUSE(); err != nil {
		return err
	}
	// Not EvalSymlinks: a stale mount cannot be stat'ed.
	mnt, err := filepath.Abs(mountpoint)
	if err != nil {
		return err
	}
	ms, err := mountsAt(mnt)
	if err != nil {
		return err
	}
	if len(ms) == 0 {
		return fmt.Errorf("%s is not mounted", mnt)
	}
	if top := ms[len(ms)-1]; !top.isFUSE() {
		return fmt.Errorf("%s is a %s mount, not a FUSE mount: refusing to unmount it", mnt, top.Type)
	}
	lazy, err := fusermount.BusyLazy(mnt)
	switch {
	case errors.Is(err, fusermount.ErrNotMounted):
		return fmt.Errorf("%s is not mounted", mnt)
	case err != nil:
		return err
	case lazy:
		fmt.Fprintf(stdout, "%s was busy (files or locks open there): detached lazily; "+
			"it goes away when the last open file there is closed\n", mnt)
	default:
		fmt.Fprintf(stdout, "unmounted %s\n", mnt)
	}
	return nil
}
