package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"github.com/lockfs/lockfs/daemon"
	"github.com/lockfs/lockfs/fs"
	"github.com/lockfs/lockfs/gcsbackend"
)

const doctorLong = `Check what a lockfs mount needs on this host, with the same flags as
lockfs mount, and say how to fix each problem: fusermount3 (setuid root for
non-root users), /dev/fuse, user_allow_other in /etc/fuse.conf for
--allow-other as non-root, the admin socket directory, the kernel's FUSE
passthrough, and with SOURCE and MOUNTPOINT the paths themselves (existing
directories, one not inside the other, SOURCE's filesystem, a mount already
there, a non-empty MOUNTPOINT) and whether files open through the mount
cost the daemon a descriptor each (they cost none with passthrough where
SOURCE's files can be opened by file handle). With --backend gcs it also proves that the
bucket can hold locks (a probe object is written, read back and deleted).
It mounts nothing. The exit status is 1 if any check fails; warnings do
not count.`

const doctorExample = `  lockfs doctor
  lockfs doctor --allow-other /srv/data /srv/locked
  lockfs doctor --backend gcs --gcs-bucket acme-locks /srv/data /srv/locked`

// checkResult is one line of lockfs doctor.
type checkResult struct {
	name   string
	status string // "ok", "warn" or "FAIL"
	detail string // what was found; for a failure, what is wrong and the fix
}

func newDoctorCmd() *cobra.Command {
	var mf mountFlags
	cmd := &cobra.Command{
		Use:     "doctor [flags] [SOURCE MOUNTPOINT]",
		Short:   "Check that this host can run a lockfs mount, and say how to fix what it lacks",
		Long:    doctorLong,
		Example: doctorExample,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 0 && len(args) != 2 {
				return usagef("want no arguments, or SOURCE and MOUNTPOINT; got %d argument%s", len(args), plural(len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := mf.gcs.validate(mf.backend); err != nil {
				return err
			}
			if err := mf.etcd.validate(mf.backend, mf.gcs.ttl); err != nil {
				return err
			}
			results := runDoctor(mf, args)
			if err := printDoctor(cmd.OutOrStdout(), results); err != nil {
				return err
			}
			failed := 0
			for _, r := range results {
				if r.status == "FAIL" {
					failed++
				}
			}
			if failed > 0 {
				return &exitCodeError{code: exitError, msg: fmt.Sprintf("lockfs doctor: %d check%s failed", failed, plural(failed))}
			}
			return nil
		},
	}
	addMountFlags(cmd.Flags(), &mf)
	completeMountFlags(cmd)
	return cmd
}

// runDoctor runs every check, whatever fails before it.
func runDoctor(mf mountFlags, args []string) []checkResult {
	var out []checkResult
	add := func(name string, err error, okDetail string) {
		if err != nil {
			out = append(out, checkResult{name, "FAIL", err.Error()})
			return
		}
		out = append(out, checkResult{name, "ok", okDetail})
	}
	fm, _ := exec.LookPath("fusermount3")
	add("fusermount3", checkFusermount(), fm)
	add("/dev/fuse", checkDevFUSE(), "can be opened")
	if mf.allowOther {
		add("--allow-other", checkAllowOther(true), "allowed")
	}
	add("admin socket directory", checkAdminDir(mf.adminDir), mf.adminDir+" is writable")
	if ok, why := passthroughSupport(); ok {
		out = append(out, checkResult{"FUSE passthrough", "ok", why})
	} else {
		out = append(out, checkResult{"FUSE passthrough", "warn", why + " (lockfs works without it, reads and writes going through the daemon)"})
	}
	if _, err := exec.LookPath("flock"); err != nil {
		out = append(out, checkResult{"flock(1)", "warn", "not found: the usual way to take a lock from a shell; `apt-get install -y util-linux`"})
	}
	if len(args) == 2 {
		paths := doctorPaths(args[0], args[1], mf.allowRemote)
		out = append(out, paths...)
		if pt, _ := passthroughSupport(); pt && mf.passthrough == "auto" && paths[0].status == "ok" {
			if ok, why := fs.OpenFilesCostNothing(args[0]); ok {
				out = append(out, checkResult{"open files", "ok", "cost the daemon no descriptor (FUSE passthrough; SOURCE's files are found again by file handle)"})
			} else {
				out = append(out, checkResult{"open files", "warn", why + ": each file open through the mount holds a descriptor of the daemon, counted by --max-open-per-uid"})
			}
		}
	}
	if mf.backend == "gcs" {
		add("gcs bucket "+mf.gcs.bucket, doctorGCS(mf), "locks can be kept there (probe written, read and deleted)")
	}
	if mf.backend == "etcd" {
		add("etcd cluster "+mf.etcd.endpoints, doctorEtcd(mf), "locks can be kept there (probe written, read and deleted; a lease granted and revoked)")
	}
	return out
}

// doctorPaths checks SOURCE and MOUNTPOINT as lockfs mount would, without
// cleaning up a stale mount.
func doctorPaths(source, mountpoint string, allowRemote bool) []checkResult {
	var out []checkResult
	src, err := existingDir("SOURCE", source)
	if err != nil {
		return append(out, checkResult{"SOURCE", "FAIL", err.Error()})
	}
	out = append(out, checkResult{"SOURCE", "ok", src})
	abs, _ := filepath.Abs(mountpoint)
	if ms, err := mountsAt(abs); err == nil && len(ms) > 0 && ms[len(ms)-1].isFUSE() {
		last := ms[len(ms)-1]
		switch err := statfsWithin(abs, probeTimeout); {
		case err == nil:
			return append(out, checkResult{"MOUNTPOINT", "FAIL", fmt.Sprintf("%s is already a FUSE mount (%s from %s): "+
				"stop its daemon or run `lockfs unmount %s` first", abs, last.Type, last.Source, abs)})
		case errors.Is(err, errProbeTimeout):
			return append(out, checkResult{"MOUNTPOINT", "FAIL", fmt.Sprintf("%s is a FUSE mount whose daemon does not answer: "+
				"run `lockfs unmount %s` first", abs, abs)})
		default:
			return append(out, checkResult{"MOUNTPOINT", "warn", fmt.Sprintf("%s has a stale mount (%v): lockfs mount removes it first", abs, err)})
		}
	}
	var warned []string
	log := logrus.New()
	log.SetOutput(io.Discard)
	log.AddHook(&warnHook{out: &warned})
	paths, err := checkPaths(src, mountpoint, allowRemote, log)
	if err != nil {
		return append(out, checkResult{"MOUNTPOINT", "FAIL", err.Error()})
	}
	out = append(out, checkResult{"MOUNTPOINT", "ok", paths.mountpoint})
	for _, w := range warned {
		out = append(out, checkResult{"SOURCE filesystem", "warn", w})
	}
	if note := nonEmptyNote(paths.mountpoint); note != "" {
		out = append(out, checkResult{"MOUNTPOINT contents", "warn", note})
	}
	return out
}

// warnHook collects the messages of warnings logged by a check.
type warnHook struct{ out *[]string }

func (h *warnHook) Levels() []logrus.Level { return []logrus.Level{logrus.WarnLevel} }
func (h *warnHook) Fire(e *logrus.Entry) error {
	*h.out = append(*h.out, e.Message)
	return nil
}

// doctorGCS proves the bucket usable, as lockfs mount does before mounting.
func doctorGCS(mf mountFlags) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := gcsbackend.New(ctx, mf.gcs.config(nil))
	if err != nil {
		return err
	}
	defer b.Close()
	return b.Check(ctx)
}

// doctorEtcd proves the etcd cluster usable, as lockfs mount does before
// mounting.
func doctorEtcd(mf mountFlags) error {
	cfg, err := daemonConfig(mf, "", nil)
	if err != nil {
		return err
	}
	return daemon.CheckBackend(cfg)
}

// printDoctor writes the results as aligned columns.
func printDoctor(w io.Writer, results []checkResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.status, r.name, strings.ReplaceAll(r.detail, "\n", " "))
	}
	return tw.Flush()
}
