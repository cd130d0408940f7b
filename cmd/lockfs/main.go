// Command lockfs mounts a directory tree through FUSE and adds hierarchical
// directory locks to it: every directory shows the control files .lock,
// .lock_newdir and .lock_usage, which unmodified programs lock with flock(2)
// or fcntl(2).
//
//	lockfs mount [flags] SOURCE MOUNTPOINT   serve SOURCE at MOUNTPOINT (foreground)
//	lockfs unmount MOUNTPOINT                unmount, lazily if busy
//	lockfs status [--json] MOUNTPOINT|PATH   who holds and waits for which lock
//	lockfs break [--kind K] PATH             forcibly end a lock (root only)
//	lockfs version                           print the version
//
// This is the only package that parses flags, installs signal handlers,
// chooses the log format or calls os.Exit.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command failed
	exitUsage = 2 // the command line was wrong
)

// errUsage marks an error in the command line: the caller prints the
// subcommand's usage hint and exits with exitUsage.
var errUsage = errors.New("usage")

// usageError wraps a message about a bad command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }
func (e *usageError) Unwrap() error { return errUsage }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

const mainUsage = `lockfs: a FUSE filesystem with hierarchical directory locks.

Usage:
  lockfs mount [flags] SOURCE MOUNTPOINT   present SOURCE at MOUNTPOINT, in the foreground
  lockfs unmount MOUNTPOINT                unmount a lockfs mount (lazily if busy)
  lockfs status [--json] MOUNTPOINT|PATH   who holds and waits for which lock
  lockfs break [--kind K] PATH             forcibly end a lock (root only)
  lockfs version                           print the version

Run "lockfs COMMAND -h" for the flags of a command.
`

func main() {
	if filepath.Base(os.Args[0]) == HelperName {
		os.Exit(report(HelperName, runMountHelper(os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// report prints a mount helper's error and returns its exit code: mount(8)
// shows the helper's stderr.
func report(name string, err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	if errors.Is(err, errUsage) {
		return exitUsage
	}
	return exitError
}

// run dispatches to a subcommand and returns the process's exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage)
		return exitUsage
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "mount":
		err = runMount(rest, stdout, stderr)
	case "unmount", "umount":
		err = runUnmount(rest, stdout, stderr)
	case "status":
		err = runStatus(rest, stdout, stderr)
	case "break":
		err = runBreak(rest, stdout, stderr)
	case "version", "--version", "-version":
		err = runVersion(rest, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, mainUsage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "lockfs: unknown command %q\n\n%s", cmd, mainUsage)
		return exitUsage
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelp):
		return exitOK
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "lockfs %s: %v\nRun \"lockfs %s -h\" for usage.\n", args[0], err, args[0])
		return exitUsage
	default:
		fmt.Fprintf(stderr, "lockfs %s: %v\n", args[0], err)
		return exitError
	}
}
