package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lockfs/lockfs/admin"
)

const statusLong = `Show every lock of a lockfs mount (or under PATH inside one) that is held
or waited for: path, kind, who holds it (host, pid, uid, command, age,
fencing token; explicit or implicit), who waits, and the backend's lease.
It asks the running daemon over its admin socket, which only root and the
mount's owner may use; holder details are shown only to root and to the
holder's own uid. Several mounts may be named at once.`

const breakLong = `Forcibly end the lock of the directory PATH (inside a lockfs mount). Root
only. Its holders are treated as on lease loss: their lock calls fail with
EIO, their process group gets the mount's --on-lease-loss signal, status
shows the hold as broken, and waiters proceed. With the gcs backend the
lease is given back, so other hosts see the lock free. The daemon logs an
audit line naming who broke what.`

// adminTarget is a path resolved to its mount's admin socket.
type adminTarget struct {
	mountpoint string
	rel        string // relative to the mount root, "." for the root
	socket     string
}

// resolveTarget finds the lockfs mount that contains path.
func resolveTarget(path, adminDir string) (adminTarget, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return adminTarget{}, err
	}
	mounts, err := lockfsMounts()
	if err != nil {
		return adminTarget{}, err
	}
	best := ""
	for _, mp := range mounts {
		if (abs == mp || strings.HasPrefix(abs, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > len(best) {
			best = mp
		}
	}
	if best == "" {
		return adminTarget{}, fmt.Errorf("%s is not inside a lockfs mount (see /proc/mounts, type fuse.lockfs)", path)
	}
	rel, err := filepath.Rel(best, abs)
	if err != nil {
		return adminTarget{}, err
	}
	return adminTarget{mountpoint: best, rel: filepath.ToSlash(rel), socket: admin.SocketPath(adminDir, best)}, nil
}

func newStatusCmd() *cobra.Command {
	var asJSON bool
	var adminDir string
	cmd := &cobra.Command{
		Use:   "status [--json] MOUNTPOINT|PATH...",
		Short: "Show who holds and waits for which lock",
		Long:  statusLong,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("name a mountpoint or a path inside one")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runStatus(args, asJSON, adminDir, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (one object per mount, in a list) instead of a table")
	cmd.Flags().StringVar(&adminDir, "admin-dir", admin.SocketDir, "directory of the daemons' admin sockets")
	return cmd
}

func runStatus(paths []string, asJSON bool, adminDir string, stdout io.Writer) error {
	var replies []admin.Reply
	for _, p := range paths {
		t, err := resolveTarget(p, adminDir)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := admin.Call(ctx, t.socket, admin.Request{Op: "status", Path: t.rel})
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", t.mountpoint, err)
		}
		replies = append(replies, r)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(replies)
	}
	for i, r := range replies {
		if len(replies) > 1 {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			fmt.Fprintf(stdout, "%s (%s, host %s)\n", r.Mountpoint, r.Backend, r.Host)
		}
		if err := admin.WriteTable(stdout, r, time.Now()); err != nil {
			return err
		}
	}
	return nil
}

func newBreakCmd() *cobra.Command {
	var kind, adminDir string
	cmd := &cobra.Command{
		Use:   "break [--kind dir|newdir|usage] PATH",
		Short: "Forcibly end a lock (root only)",
		Long:  breakLong,
		Args:  exactArgs(1, "one PATH, the directory whose lock to break"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBreak(args[0], kind, adminDir, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&kind, "kind", "dir", "which lock of the directory: dir (.lock), newdir (.lock_newdir) or usage (.lock_usage)")
	cmd.Flags().StringVar(&adminDir, "admin-dir", admin.SocketDir, "directory of the daemons' admin sockets")
	return cmd
}

func runBreak(path, kind, adminDir string, stdout io.Writer) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("only root may break a lock")
	}
	t, err := resolveTarget(path, adminDir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.Call(ctx, t.socket, admin.Request{Op: "break", Path: t.rel, Kind: kind}); err != nil {
		return fmt.Errorf("%s: %w", t.mountpoint, err)
	}
	fmt.Fprintf(stdout, "broke the %s lock of %s\n", kind, filepath.Join(t.mountpoint, t.rel))
	return nil
}
