package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/lockfs/lockfs/internal/fusermount"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// The checks a mount needs before it can work, shared by `lockfs mount`
// (which stops at the first failure) and `lockfs doctor` (which runs them
// all). Each failure says what is wrong and how to fix it.

// fuseDevice is the FUSE character device.
const fuseDevice = "/dev/fuse"

// fuseConf is fuse3's configuration file, where user_allow_other lives.
const fuseConf = "/etc/fuse.conf"

// checkFusermount reports a missing fusermount3, or (for a non-root user,
// who mounts through it) one that is not setuid root.
func checkFusermount() error {
	path, err := exec.LookPath("fusermount3")
	if err != nil {
		return fmt.Errorf("fusermount3 not found in $PATH: %s", fusermount.InstallHint)
	}
	if os.Geteuid() == 0 {
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("fusermount3 %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil && (fi.Mode()&os.ModeSetuid == 0 || st.Uid != 0) {
		return fmt.Errorf("%s is not setuid root (%v, owner uid %d), so a non-root user cannot mount with it: "+
			"as root, `chown root %s && chmod u+s %s` (Debian's fuse3 package installs it so), or mount as root", path, fi.Mode(), st.Uid, path, path)
	}
	return nil
}

// checkDevFUSE reports a /dev/fuse that is missing or that this user cannot
// open (fusermount3 opens it with the caller's permissions).
func checkDevFUSE() error {
	f, err := os.OpenFile(fuseDevice, os.O_RDWR, 0)
	if err == nil {
		f.Close()
		return nil
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%s is missing: load the fuse module with `modprobe fuse`, "+
			"or in a container pass --device /dev/fuse", fuseDevice)
	case errors.Is(err, os.ErrPermission):
		mode := ""
		if fi, serr := os.Stat(fuseDevice); serr == nil {
			mode = fmt.Sprintf(" (mode %v)", fi.Mode().Perm())
		}
		return fmt.Errorf("%s: permission denied for uid %d%s: a non-root user needs it readable and writable by all, "+
			"as Debian's udev rule makes it: as root, `chmod 0666 %s`; or mount as root", fuseDevice, os.Geteuid(), mode, fuseDevice)
	}
	return fmt.Errorf("%s: %w", fuseDevice, err)
}

// checkFUSE runs the checks every FUSE mount and unmount needs.
func checkFUSE() error {
	if err := checkFusermount(); err != nil {
		return err
	}
	return checkDevFUSE()
}

// checkAllowOther reports that --allow-other cannot work: a non-root user
// needs user_allow_other in /etc/fuse.conf.
func checkAllowOther(allowOther bool) error {
	if !allowOther || os.Geteuid() == 0 {
		return nil
	}
	ok, err := fuseConfAllowsOther(fuseConf)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("--allow-other: reading %s: %w", fuseConf, err)
	}
	if !ok {
		return fmt.Errorf("--allow-other as a non-root user needs the line `user_allow_other` in %s: "+
			"as root, `echo user_allow_other >> %s`; or mount without --allow-other, or as root", fuseConf, fuseConf)
	}
	return nil
}

// fuseConfAllowsOther reports whether the fuse.conf at path has an
// uncommented user_allow_other line.
func fuseConfAllowsOther(path string) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line == "user_allow_other" {
			return true, nil
		}
	}
	return false, sc.Err()
}

// checkAdminDir reports an admin socket directory this user cannot create
// or write, with the way out.
func checkAdminDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("admin socket directory %s: %w: as a non-root user pass --admin-dir DIR "+
			"(for example --admin-dir \"$XDG_RUNTIME_DIR/lockfs\"), and the same to lockfs status and break", dir, err)
	}
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("admin socket directory %s is not writable for uid %d: pass --admin-dir DIR "+
			"(for example --admin-dir \"$XDG_RUNTIME_DIR/lockfs\"), and the same to lockfs status and break", dir, os.Geteuid())
	}
	return nil
}

// hiddenEntries lists up to max names in dir, and how many there are: what
// a mount at dir hides while it is up.
func hiddenEntries(dir string, max int) (names []string, n int, err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	for {
		batch, err := f.Readdirnames(256)
		n += len(batch)
		names = append(names, batch...)
		if errors.Is(err, io.EOF) || len(batch) == 0 {
			break
		}
		if err != nil {
			return nil, 0, err
		}
	}
	sort.Strings(names)
	if len(names) > max {
		names = names[:max]
	}
	return names, n, nil
}

// warnNonEmpty logs a warning when the mountpoint has entries: the mount
// hides them (they are not lost, and come back when it is unmounted).
func warnNonEmpty(mountpoint string, log logrus.FieldLogger) {
	if msg := nonEmptyNote(mountpoint); msg != "" {
		log.WithField("mountpoint", mountpoint).Warn(msg)
	}
}

// nonEmptyNote describes what a mount at mountpoint hides, "" if nothing.
func nonEmptyNote(mountpoint string) string {
	names, n, err := hiddenEntries(mountpoint, 5)
	if err != nil || n == 0 {
		return ""
	}
	list := strings.Join(names, ", ")
	if n > len(names) {
		list += ", ..."
	}
	if n == 1 {
		return fmt.Sprintf("MOUNTPOINT is not empty: the mount hides its 1 entry (%s) until it is unmounted; "+
			"it is not deleted, but nothing can reach it through %s meanwhile", list, mountpoint)
	}
	return fmt.Sprintf("MOUNTPOINT is not empty: the mount hides its %d entries (%s) until it is unmounted; "+
		"they are not deleted, but nothing can reach them through %s meanwhile", n, list, mountpoint)
}

// passthroughSupport says whether the kernel can do FUSE passthrough (reads
// and writes of open files straight to SOURCE, Linux 6.9+ built with
// CONFIG_FUSE_PASSTHROUGH), and why not. lockfs works without it, slower.
func passthroughSupport() (bool, string) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return false, "uname: " + err.Error()
	}
	release := unix.ByteSliceToString(uts.Release[:])
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return false, "cannot read the kernel version " + release
	}
	if major < 6 || major == 6 && minor < 9 {
		return false, fmt.Sprintf("kernel %s is older than 6.9, the first with FUSE passthrough: upgrade the kernel for faster reads and writes", release)
	}
	if v, ok := kernelConfig("CONFIG_FUSE_PASSTHROUGH"); ok && v != "y" {
		return false, fmt.Sprintf("kernel %s is built without CONFIG_FUSE_PASSTHROUGH: use a kernel built with it for faster reads and writes", release)
	}
	if os.Geteuid() != 0 {
		return false, fmt.Sprintf("kernel %s has FUSE passthrough, but it needs CAP_SYS_ADMIN: mount as root to use it", release)
	}
	return true, "kernel " + release + " has FUSE passthrough"
}

// kernelConfig returns a CONFIG_ option's value from /proc/config.gz or
// /boot/config-RELEASE; ok is false when neither can be read.
func kernelConfig(name string) (value string, ok bool) {
	var r io.Reader
	if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		if z, err := gzip.NewReader(f); err == nil {
			r = z
		}
	}
	if r == nil {
		var uts unix.Utsname
		_ = unix.Uname(&uts)
		f, err := os.Open(filepath.Join("/boot", "config-"+unix.ByteSliceToString(uts.Release[:])))
		if err != nil {
			return "", false
		}
		defer f.Close()
		r = f
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if v, found := strings.CutPrefix(line, name+"="); found {
			return v, true
		}
		if line == "# "+name+" is not set" {
			return "n", true
		}
	}
	return "n", sc.Err() == nil
}
