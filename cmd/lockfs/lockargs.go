package main

// The command line of "lockfs lock": flock(1)'s, checked into a lockRequest.

import (
	"path/filepath"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
)

// lockBackends are the values lockfs lock's --backend accepts: the local
// backend is --source.
var lockBackends = []string{"gcs", "etcd"}

// lockRequest is a validated "lockfs lock" command line.
type lockRequest struct {
	target   string // the directory
	mode     lockmgr.Mode
	kind     lockmgr.Kind
	nonblock bool          // fail at once if the lock is held
	wait     time.Duration // with !nonblock: at most this long (0: for ever)
	command  []string
}

// controlKind returns the kind whose control file is named name.
func controlKind(name string) (lockmgr.Kind, bool) {
	for _, k := range []lockmgr.Kind{lockmgr.KindDir, lockmgr.KindNewDir, lockmgr.KindUsage} {
		if name == lockmgr.ControlName(k) {
			return k, true
		}
	}
	return 0, false
}

// parseLockArgs checks the flags and splits args into TARGET and COMMAND.
func parseLockArgs(lf lockFlags, args []string) (lockRequest, error) {
	var r lockRequest
	if lf.unlock {
		return r, usagef("-u: lockfs lock holds no descriptor for the shell to unlock (flock -u FD does that); " +
			"its lock ends when COMMAND ends")
	}
	if lf.shared && lf.exclusive {
		return r, usagef("-s and -x exclude each other")
	}
	if lf.nonblock && lf.wait > 0 {
		return r, usagef("-n and -w exclude each other")
	}
	if lf.waitSet && lf.wait == 0 {
		lf.nonblock = true // as flock(1): -w 0 is -n
	}
	r.nonblock, r.wait = lf.nonblock, lf.wait
	if lf.conflictCode < 0 || lf.conflictCode > 255 {
		return r, usagef("-E %d: want an exit status from 0 to 255", lf.conflictCode)
	}
	kind, err := lockmgr.ParseKind(lf.kind)
	if err != nil {
		return r, usagef("--kind %q: want dir, newdir or usage", lf.kind)
	}
	if len(args) > 0 {
		// A control file as TARGET, as flock(1) users name it: the
		// directory is its parent, the kind its name's.
		if k, ok := controlKind(filepath.Base(args[0])); ok {
			if lf.kindSet && k != kind {
				return r, usagef("--kind %s and TARGET %s name different locks", lf.kind, args[0])
			}
			kind = k
			args = append([]string{filepath.Dir(args[0])}, args[1:]...)
		}
	}
	r.kind, r.mode = kind, lockmgr.Exclusive
	if lf.shared {
		if kind == lockmgr.KindUsage {
			return r, usagef("-s: a usage lock is exclusive only")
		}
		r.mode = lockmgr.Shared
	}
	switch {
	case lf.backend != "" && !contains(lockBackends, lf.backend):
		return r, usagef("--backend %q: lockfs lock takes --backend gcs or etcd, or --source SOURCE for the local backend", lf.backend)
	case lf.backend != "" && lf.source != "":
		return r, usagef("--source and --backend %s exclude each other", lf.backend)
	}
	backend := lf.backend
	if backend == "" {
		backend = "local"
	}
	if err := lf.gcs.validate(backend); err != nil {
		return r, err
	}
	if err := lf.etcd.validate(backend, lf.gcs.ttl); err != nil {
		return r, err
	}
	r.target, r.command, err = parseLockCommand(lf.shellCommand, args)
	return r, err
}

// parseLockCommand reads TARGET and COMMAND (or the -c command line
// shellCommand, given before or after TARGET) from args.
func parseLockCommand(shellCommand string, args []string) (target string, command []string, err error) {
	if len(args) == 0 {
		return "", nil, usagef("want TARGET and COMMAND")
	}
	target, args = args[0], args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	} else if len(args) > 0 && (args[0] == "-c" || args[0] == "--command") {
		// "TARGET -c 'command line'", as flock(1) takes it.
		if len(args) != 2 || shellCommand != "" {
			return "", nil, usagef("%s after TARGET takes one command line", args[0])
		}
		shellCommand, args = args[1], nil
	}
	switch {
	case shellCommand != "" && len(args) > 0:
		return "", nil, usagef("-c and COMMAND exclude each other")
	case shellCommand != "":
		return target, []string{"/bin/sh", "-c", shellCommand}, nil
	case len(args) == 0:
		return "", nil, usagef("want COMMAND after TARGET (or -c 'command line')")
	}
	return target, args, nil
}
