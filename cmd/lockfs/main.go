// Command lockfs mounts a directory tree through FUSE and adds hierarchical
// directory locks to it: every directory has the control files .lock,
// .lock_newdir and .lock_usage, which unmodified programs lock with flock(2)
// or fcntl(2).
//
//	lockfs mount [flags] SOURCE MOUNTPOINT   serve SOURCE at MOUNTPOINT (foreground)
//	lockfs unmount MOUNTPOINT                unmount, lazily if busy
//	lockfs status [--json] [PATH...]         who holds and waits for which lock (all mounts)
//	lockfs break [--kind K] PATH             forcibly end a lock (root only)
//	lockfs doctor [flags] [SOURCE MOUNTPOINT] check what a mount needs, with fixes
//	lockfs version                           print the version
//
// The command line is built with cobra and pflag (GNU flags, help for every
// command, shell completion, man pages from the same command tree).
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
	"runtime"

	"github.com/spf13/cobra"
)

// Exit codes of every command (docs/OPERATIONS.md#exit-status): 0, 1 when
// the command failed, and 64 (EX_USAGE of sysexits.h) for a bad command
// line, as flock(1) exits and so "lockfs lock" must; "lockfs lock" adds
// its own (lock.go). The mount helper follows mount(8) instead (report).
const (
	exitOK    = 0
	exitError = 1  // the command failed
	exitUsage = 64 // EX_USAGE: the command line was wrong
)

// Exit codes of the mount helper, mount(8)'s: mount(8) passes them on.
const (
	helperExitUsage = 1  // incorrect invocation or permissions
	helperExitFail  = 32 // mount failure
)

// errUsage marks an error in the command line: run prints it with a hint
// to the command's help and exits with exitUsage.
var errUsage = errors.New("usage")

// usageError wraps a message about a bad command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }
func (e *usageError) Unwrap() error { return errUsage }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// exitCodeError ends a command with a given exit code, after its message (if
// any) was printed: "lockfs lock" passes its COMMAND's status on with it.
type exitCodeError struct {
	code int
	msg  string // printed on stderr when not empty
}

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	if filepath.Base(os.Args[0]) == HelperName {
		os.Exit(report(HelperName, runMountHelper(os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// report prints a mount helper's error and returns its exit code as
// mount(8) documents them: mount(8) shows the helper's stderr and exits
// with its status.
func report(name string, err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	if errors.Is(err, errUsage) {
		return helperExitUsage
	}
	return helperExitFail
}

const rootLong = `lockfs: a FUSE filesystem with hierarchical directory locks.

Every directory of a lockfs mount has the control files .lock, .lock_newdir
and .lock_usage; lock them with flock(1), flock(2) or fcntl(2), and read them
to see who holds the lock. "lockfs lock" runs a command under such a lock,
through a mount or with no mount at all.`

// newRootCmd builds the command tree. Every command writes its output to
// stdout and its help to stdout; errors are returned, and run prints them.
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "lockfs",
		Short:         "A FUSE filesystem with hierarchical directory locks",
		Long:          rootLong,
		Version:       Version(),
		SilenceErrors: true,
		SilenceUsage:  true,
		// An unknown command is a usage error with suggestions.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q", args[0])
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += fmt.Sprintf("; did you mean %q?", s[0])
			}
			return usagef("%s", msg)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("name a command")
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.Flags().BoolP("version", "V", false, "print the version and exit")
	root.SetVersionTemplate(versionLine() + "\n")
	root.SetFlagErrorFunc(flagError)
	root.SuggestionsMinimumDistance = 2
	root.AddCommand(
		newMountCmd(),
		newUnmountCmd(),
		newStatusCmd(),
		newBreakCmd(),
		newLockCmd(),
		newDoctorCmd(),
		newVersionCmd(),
		newManCmd(),
		newCompletionCmd(),
	)
	root.SetHelpCommand(newHelpCmd())
	return root
}

// run executes the command line and returns the process's exit code:
// exitOK, exitError after an error, exitUsage after a bad command line, or
// the code an exitCodeError carries.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	var ec *exitCodeError
	if errors.As(err, &ec) {
		if ec.msg != "" {
			fmt.Fprintln(stderr, ec.msg)
		}
		return ec.code
	}
	name := "lockfs"
	if cmd != nil {
		name = cmd.CommandPath()
	}
	if errors.Is(err, errUsage) {
		fmt.Fprintf(stderr, "%s: %v\nRun \"%s --help\" for usage.\n", name, err, name)
		if cmd == root && len(args) == 0 {
			fmt.Fprintln(stderr)
			root.SetOut(stderr)
			root.Usage()
		}
		return exitUsage
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return exitError
}

// versionLine is what "lockfs version" and "lockfs -V" print.
func versionLine() string {
	return fmt.Sprintf("lockfs %s (%s %s/%s)", Version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// exactArgs returns a cobra Args check that wants exactly n positional
// arguments, named in the error.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("want %s; got %d argument%s", what, len(args), plural(len(args)))
		}
		return nil
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
