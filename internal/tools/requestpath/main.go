// Command requestpath counts the files of the module that one lock request
// through a lockfs mount visits, and how often it comes back to a file it
// had left: the measure docs/ARCHITECTURE.md and issue 30 use for how
// easily a reader can follow a request.
//
// It copies the tree at a git revision into a scratch directory, makes
// every function of the copy's product code record its calls and returns
// (instrument.go), builds that lockfs, mounts it over a fresh SOURCE,
// takes the lock with `flock -x`, unmounts, and reads the path of the
// request's LockWait handler out of the trace (count.go): each time the
// request's goroutine moves to another file, by a call or a return, is one
// step; a step into a file visited before is a return. Nothing of the
// repository is changed. Needs root, /dev/fuse, fusermount3, flock(1), git
// and go.
//
//	go run ./internal/tools/requestpath [-rev HEAD] [-lock a/b/.lock] [-steps]
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	repo := flag.String("repo", ".", "the repository")
	rev := flag.String("rev", "HEAD", "the revision to measure")
	lock := flag.String("lock", "a/b/.lock", "the control file to take, relative to the mount")
	steps := flag.Bool("steps", false, "also print every step of the path")
	keep := flag.Bool("keep", false, "keep the scratch directory (its trace and daemon log)")
	flag.Parse()
	if err := run(*repo, *rev, *lock, *steps, *keep, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "requestpath:", err)
		os.Exit(1)
	}
}

func run(repo, rev, lock string, steps, keep bool, w io.Writer) error {
	work, err := os.MkdirTemp("", "requestpath-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Fprintln(w, "scratch directory:", work)
	} else {
		defer os.RemoveAll(work)
	}
	tree := filepath.Join(work, "tree")
	if err := exportTree(repo, rev, tree); err != nil {
		return err
	}
	module, err := moduleName(filepath.Join(tree, "go.mod"))
	if err != nil {
		return err
	}
	if err := instrumentTree(tree, module); err != nil {
		return fmt.Errorf("instrument: %w", err)
	}
	bin := filepath.Join(work, "lockfs")
	build := exec.Command("go", "build", "-tags", "disable_grpc_modules", "-o", bin, "./cmd/lockfs")
	build.Dir = tree
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build the instrumented lockfs: %v: %s", err, out)
	}
	trace := filepath.Join(work, "trace")
	if err := lockThroughMount(work, bin, trace, lock); err != nil {
		return err
	}
	f, err := os.Open(trace)
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := requestPath(f, "LockWait")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "flock -x %s at %s: %d files, %d returns to a file left before\n", lock, rev, len(p.files), p.total())
	for _, file := range p.files {
		fmt.Fprintf(w, "  %-36s %3d returns\n", file, p.returns[file])
	}
	if steps {
		fmt.Fprintln(w, strings.Join(p.steps, " > "))
	}
	return nil
}

// exportTree writes the files of rev into dir.
func exportTree(repo, rev, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	archive := exec.Command("git", "-C", repo, "archive", rev)
	untar := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	if err := archive.Start(); err != nil {
		return err
	}
	if out, err := untar.CombinedOutput(); err != nil {
		_ = archive.Wait()
		return fmt.Errorf("tar -x: %v: %s", err, out)
	}
	if err := archive.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w", rev, err)
	}
	return nil
}

func moduleName(gomod string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m, ok := strings.CutPrefix(sc.Text(), "module "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	return "", fmt.Errorf("%s names no module", gomod)
}

// lockThroughMount mounts bin over a fresh SOURCE that has lock's
// directory, with the trace going to trace, runs `flock -x lock true`
// through the mount, and unmounts. The mount and the daemon never outlive
// it.
func lockThroughMount(work, bin, trace, lock string) error {
	src, mnt := filepath.Join(work, "src"), filepath.Join(work, "mnt")
	if err := os.MkdirAll(filepath.Join(src, filepath.Dir(lock)), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(work, "daemon.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	daemon := exec.Command(bin, "mount", src, mnt)
	daemon.Env = append(os.Environ(), "LOCKFS_CALLTRACE="+trace)
	daemon.Stdout, daemon.Stderr = logf, logf
	daemon.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := daemon.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- daemon.Wait() }()
	defer stopDaemon(daemon, mnt, exited)

	if err := waitMounted(mnt, exited); err != nil {
		return fmt.Errorf("%w (daemon log: %s)", err, logf.Name())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	flock := exec.CommandContext(ctx, "flock", "-x", filepath.Join(mnt, lock), "true")
	flock.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if out, err := flock.CombinedOutput(); err != nil {
		return fmt.Errorf("flock -x %s: %v: %s", lock, err, out)
	}
	return nil
}

// waitMounted waits until mnt is a FUSE mount, or the daemon exits.
func waitMounted(mnt string, exited <-chan error) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if mounted(mnt) {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("lockfs mount exited before mounting: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return errors.New("lockfs mount did not mount within a minute")
}

// mounted reports whether /proc/self/mountinfo lists a mount at dir.
func mounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// stopDaemon unmounts mnt (lazily if it is busy), which ends the daemon;
// one that has not exited after 10 s is killed.
func stopDaemon(daemon *exec.Cmd, mnt string, exited <-chan error) {
	if mounted(mnt) && exec.Command("fusermount3", "-u", mnt).Run() != nil {
		_ = exec.Command("fusermount3", "-uz", mnt).Run()
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = daemon.Process.Kill()
		<-exited
	}
}
