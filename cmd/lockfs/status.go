package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lockfs/lockfs/admin"
)

const statusLong = `Show every lock of a lockfs mount (or at or under PATH inside one) that is
held or waited for: path, kind, who holds it (host, pid, uid, command line
and, for flock(1) or lockfs lock, the command it runs; age, fencing token;
explicit or implicit), who waits (pid, command, the lock it asked for and
since when), and the backend's lease. A request for a lock under PATH that
waits on a lock above it (held by someone else) is shown on that lock's
row. A table with nothing in it says "no locks".

It asks the running daemons over their admin sockets in --admin-dir, which
only root and each mount's owner may use; holder details are shown only to
root and to the holder's own uid.

Without a PATH, every lockfs mount of this host that can be reached is
shown; the mounts that cannot (another user's, or a daemon started with
another --admin-dir) are counted on one line on stderr, with the reason.
The exit status is then 0 if at least one mount was shown and every daemon
with a socket in --admin-dir answered, else 1. With PATHs, a PATH that cannot be shown is reported on stderr, the
others are still shown, and the exit status is 1.`

const breakLong = `Forcibly end the lock of the directory PATH (inside a lockfs mount). Root
only. Its holders are treated as on lease loss: their lock calls fail with
EIO, they and their descendants get the mount's --on-lease-loss signal, status
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
		// Only here is path looked up: inside a mount, a lookup would
		// hang on a daemon that does not answer, and status is what
		// one runs then.
		if _, err := os.Lstat(abs); errors.Is(err, fs.ErrNotExist) {
			return adminTarget{}, fmt.Errorf("%s: no such file or directory", path)
		}
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
		Use:   "status [--json] [MOUNTPOINT|PATH...]",
		Short: "Show who holds and waits for which lock",
		Long:  statusLong,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runStatus(args, asJSON, adminDir, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (one object per mount, in a list) instead of a table")
	cmd.Flags().StringVar(&adminDir, "admin-dir", admin.SocketDir, "directory of the daemons' admin sockets")
	return cmd
}

func runStatus(paths []string, asJSON bool, adminDir string, stdout, stderr io.Writer) error {
	if len(paths) == 0 {
		return runStatusAll(asJSON, adminDir, stdout, stderr)
	}
	replies := []admin.Reply{}
	failed := 0
	for _, p := range paths {
		r, err := statusOf(p, adminDir)
		if err != nil {
			fmt.Fprintf(stderr, "lockfs status: %v\n", err)
			failed++
			continue
		}
		replies = append(replies, r)
	}
	if err := printStatus(replies, asJSON, len(replies) > 1, stdout); err != nil {
		return err
	}
	if failed > 0 {
		return &exitCodeError{code: exitError} // each failure is on stderr already
	}
	return nil
}

// runStatusAll shows every lockfs mount it can reach, and says on one line
// which it could not and why. A mount with no socket in adminDir (its
// daemon was started with another --admin-dir) or that refuses the caller
// (another user's) is only counted; it fails if a daemon whose socket is
// there did not answer, or if no mount at all could be shown.
func runStatusAll(asJSON bool, adminDir string, stdout, stderr io.Writer) error {
	mounts, err := lockfsMounts()
	if err != nil {
		return err
	}
	if len(mounts) == 0 {
		fmt.Fprintln(stderr, "lockfs status: no lockfs mount on this host (none of type fuse.lockfs in /proc/self/mountinfo)")
		return nil
	}
	replies := []admin.Reply{}
	var missed unreachable
	for _, mp := range mounts {
		r, err := statusOf(mp, adminDir)
		if err != nil {
			missed.add(mp, err)
			continue
		}
		replies = append(replies, r)
	}
	if err := printStatus(replies, asJSON, true, stdout); err != nil {
		return err
	}
	if line := missed.summary(len(mounts), adminDir); line != "" {
		fmt.Fprintln(stderr, "lockfs status: "+line)
	}
	if len(replies) == 0 || len(missed.other) > 0 {
		return &exitCodeError{code: exitError}
	}
	return nil
}

// unreachable collects the mounts whose daemons status could not ask, by
// reason.
type unreachable struct {
	noSocket, refused, other []string
	otherErr                 error // the first other error, as an example
}

func (u *unreachable) add(mountpoint string, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		u.noSocket = append(u.noSocket, mountpoint)
	case errors.Is(err, fs.ErrPermission) || strings.Contains(err.Error(), "permission denied"):
		u.refused = append(u.refused, mountpoint)
	default:
		if u.otherErr == nil {
			u.otherErr = err
		}
		u.other = append(u.other, mountpoint)
	}
}

// summary is the one line that says which mounts were not shown and why,
// or "".
func (u *unreachable) summary(total int, adminDir string) string {
	n := len(u.noSocket) + len(u.refused) + len(u.other)
	if n == 0 {
		return ""
	}
	var why []string
	if len(u.noSocket) > 0 {
		why = append(why, fmt.Sprintf("%s no admin socket in %s (started with another --admin-dir? pass the same --admin-dir to lockfs status)",
			countMounts(u.noSocket, "has", "have"), adminDir))
	}
	if len(u.refused) > 0 {
		why = append(why, fmt.Sprintf("%s you (only root and the mount's owner may ask)", countMounts(u.refused, "refuses", "refuse")))
	}
	if len(u.other) > 0 {
		why = append(why, fmt.Sprintf("%s not answer: %v", countMounts(u.other, "did", "did"), u.otherErr))
	}
	return fmt.Sprintf("%d of %d mount%s not shown: %s", n, total, plural(total), strings.Join(why, "; "))
}

// countMounts renders "2 (/a, /b) have": a count of mountpoints, the first
// ten named, and the verb agreeing with the count.
func countMounts(mps []string, one, many string) string {
	const named = 10
	names := mps
	more := ""
	if len(names) > named {
		names, more = names[:named], fmt.Sprintf(" and %d more", len(mps)-named)
	}
	verb := many
	if len(mps) == 1 {
		verb = one
	}
	return fmt.Sprintf("%d (%s%s) %s", len(mps), strings.Join(names, ", "), more, verb)
}

// statusOf asks the daemon of the mount that holds path for its locks at
// or under path.
func statusOf(path, adminDir string) (admin.Reply, error) {
	t, err := resolveTarget(path, adminDir)
	if err != nil {
		return admin.Reply{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := admin.Call(ctx, t.socket, admin.Request{Op: "status", Path: t.rel})
	if errors.Is(err, fs.ErrNotExist) {
		return admin.Reply{}, fmt.Errorf("%s: %w; a daemon started with another --admin-dir has its socket there: pass the same --admin-dir", t.mountpoint, err)
	}
	if err != nil {
		return admin.Reply{}, fmt.Errorf("%s: %w", t.mountpoint, err)
	}
	if r.Mountpoint != t.mountpoint {
		return admin.Reply{}, fmt.Errorf("%s: the admin socket %s answers for %s", t.mountpoint, t.socket, r.Mountpoint)
	}
	return r, nil
}

// printStatus writes the replies as JSON (a list, one object per mount or
// PATH) or as tables, with a header line per reply if headers.
func printStatus(replies []admin.Reply, asJSON, headers bool, stdout io.Writer) error {
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(replies)
	}
	for i, r := range replies {
		if headers {
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
	completeValues(cmd, "kind", kinds...)
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
