package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// HelperName is the name mount(8) runs for filesystems of type fuse.lockfs:
// "make install" links /sbin/mount.fuse.lockfs to the lockfs binary.
const HelperName = "mount.fuse.lockfs"

// helperTimeout bounds how long the mount helper waits for the daemon to
// mount.
const helperTimeout = 60 * time.Second

// LogDir is where daemons started by the mount helper log.
const LogDir = "/var/log/lockfs"

// optionsToFlags turns a mount -o option string into "lockfs mount" flags,
// and the log file option (see options.go: the options are the flags of
// "lockfs mount", and their values are checked here, before the daemon
// starts).
func optionsToFlags(opts string) (flags []string, logFile string, err error) {
	set, logFile, err := parseMountOptions(opts, newMountCmd().Flags(), nil)
	if err != nil {
		return nil, "", err
	}
	for _, o := range set {
		flags = append(flags, o.flag())
	}
	return flags, logFile, nil
}

// runMountHelper is what mount(8) runs for an /etc/fstab line of type
// fuse.lockfs:
//
//	mount.fuse.lockfs SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]
//
// It starts "lockfs mount" with the options as flags, detached from the
// terminal and logging to /var/log/lockfs/MOUNT.log, waits until the mount
// is up, and exits 0; or it prints the daemon's error and exits 32
// (mount(8)'s "mount failure"; 1 for a bad invocation).
// "umount MOUNTPOINT" stops the daemon (it releases every lock and exits
// when the kernel ends the mount).
func runMountHelper(args []string, stdout, stderr io.Writer) error {
	pos, opts, fake, err := parseHelperArgs(args)
	if err != nil {
		return err
	}
	flags, logFile, err := optionsToFlags(opts)
	if err != nil {
		return err
	}
	if fake {
		return nil
	}
	mountpoint, err := filepath.Abs(pos[1])
	if err != nil {
		return err
	}
	if logFile == "" {
		logFile = filepath.Join(LogDir, strings.ReplaceAll(strings.Trim(mountpoint, "/"), "/", "-")+".log")
	}
	return startDetached(append(append([]string{"mount"}, flags...), pos[0], mountpoint), mountpoint, logFile)
}

// parseHelperArgs reads mount(8)'s command line of a helper: SOURCE
// MOUNTPOINT, the options of every -o, and -f (fake: check, mount nothing).
func parseHelperArgs(args []string) (pos []string, opts string, fake bool, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o" && i+1 < len(args):
			i++
			opts += "," + args[i]
		case strings.HasPrefix(a, "-o"):
			opts += "," + a[2:]
		case a == "-t" && i+1 < len(args):
			i++
		case a == "-f":
			fake = true
		case a == "-s" || a == "-n" || a == "-v":
		case strings.HasPrefix(a, "-"):
			return nil, "", false, usagef("unknown argument %q", a)
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return nil, "", false, usagef("want SOURCE MOUNTPOINT [-o OPTIONS]; got %q", args)
	}
	return pos, opts, fake, nil
}

// startDetached starts "lockfs ARGS" in a session of its own, logging to
// logFile, and returns once a lockfs mount is at mountpoint; if the daemon
// exits first, the error carries what it logged.
func startDetached(args []string, mountpoint, logFile string) error {
	if err := os.MkdirAll(filepath.Dir(logFile), 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	defer logf.Close()
	start, _ := logf.Seek(0, io.SeekEnd)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	cmd := exec.Command(self, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	// mount(8) runs helpers with a minimal environment; the daemon needs
	// fusermount3 on PATH.
	// The detached daemon is not the main process of whatever unit runs
	// mount(8): its notifications would only be refused there.
	cmd.Env = append(withoutEnv(os.Environ(), notifySocketEnv), "PATH="+helperPath(os.Getenv("PATH")))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(helperTimeout)
	for {
		if up, _ := isLockfsMountpoint(mountpoint); up {
			// The daemon lives on, detached; this process leaves it.
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("lockfs mount exited (%v) before mounting:\n%s", err, tail(logFile, start))
		case <-deadline:
			_ = cmd.Process.Kill()
			return fmt.Errorf("lockfs mount did not mount %s within %v; see %s", mountpoint, helperTimeout, logFile)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// isLockfsMountpoint reports whether a lockfs mount is at path.
func isLockfsMountpoint(path string) (bool, error) {
	mps, err := lockfsMounts()
	if err != nil {
		return false, err
	}
	for _, mp := range mps {
		if mp == path {
			return true, nil
		}
	}
	return false, nil
}

// tail returns what a log file got since offset, at most 40 lines.
func tail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 40 {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// helperPath returns path with the standard system directories appended.
func helperPath(path string) string {
	std := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	if path == "" {
		return std
	}
	return path + ":" + std
}

// withoutEnv returns env without the variable name.
func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}
