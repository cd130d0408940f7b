// Command requestpath counts the files of the module that one lock request
// through a lockfs mount visits, and how often it comes back to a file it
// had left: the measure docs/ARCHITECTURE.md and issue 30 use for how
// easily a reader can follow a request.
//
// It copies the tree at a git revision into a scratch directory, makes
// every function of the copy's product code record its calls and returns
// (instrument.go), builds that lockfs, mounts it over a fresh SOURCE,
// takes the lock with `flock -x`, unmounts, and reads the path of the
// request's LockWaitDeferred handler out of the trace (count.go): each time the
// request's goroutine moves to another file, by a call or a return, is one
// step; a step into a file visited before is a return. Nothing of the
// repository is changed.
//
// It prints the same trace counted several ways. The first row is the
// rule issue 30's figures quote (followed, count.go): a reader reads each
// function once, does not open the hooks around the request (observer,
// metrics, the FUSE server's), does not open a leaf (a call under which
// the request runs no other function of the module: maxMode, lease.Mode;
// its name reads like a library call's), and follows the request to the
// backend's entry (Backend.Claim, whose file counts) but not through the
// backend's own way to its answer, which is the backend's story behind
// lockmgr.Backend, different for each backend. The second row follows
// into the (local) backend. The strict rows follow: read once without
// hooks, read once, and every call executed. Needs root, /dev/fuse, fusermount3, flock(1), git
// and go.
//
//	go run ./internal/tools/requestpath [-rev HEAD] [-lock a/b/.lock] [-from LockWaitDeferred] [-steps] [-keep | -trace FILE]
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
	trace := flag.String("trace", "", "count the trace a -keep run left in this file, instead of making one")
	from := flag.String("from", "LockWaitDeferred", "count from the first call of this function (the part of its name after the last dot) to its return: LockWaitDeferred, the FUSE handler (LockWait before the deferred lock waits of 2026-12-03); AcquireAsync (Acquire before), the engine's part")
	flag.Parse()
	var err error
	if *trace != "" {
		err = count(*trace, *from, *lock, *rev, *steps, os.Stdout)
	} else {
		err = run(*repo, *rev, *lock, *from, *steps, *keep, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "requestpath:", err)
		os.Exit(1)
	}
}

func run(repo, rev, lock, from string, steps, keep bool, w io.Writer) error {
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
	return count(trace, from, lock, rev, steps, w)
}

// count prints the path of the lock request that trace recorded, from the
// first call of the function named from to its return.
func count(trace, from, lock, rev string, steps bool, w io.Writer) error {
	f, err := os.Open(trace)
	if err != nil {
		return err
	}
	defer f.Close()
	root, err := requestCalls(f, from)
	if err != nil {
		return err
	}
	h, o, r, x := read(root, hookFile), read(root, observerHook), read(root, nil), executed(root)
	b, l := followed(root, true), followed(root, false)
	fmt.Fprintf(w, "flock -x %s at %s, from %s:\n", lock, rev, root.fn)
	fmt.Fprintf(w, "  by the rule, to the backend's entry:     %2d files, %3d returns (read once, without hooks and leaves)\n", len(b.files), b.total())
	fmt.Fprintf(w, "  by the rule, into the backend:           %2d files, %3d returns\n", len(l.files), l.total())
	fmt.Fprintf(w, "  read once, without hooks:                %2d files, %3d returns to a file left before\n", len(h.files), h.total())
	fmt.Fprintf(w, "  read once, without the observer's hooks: %2d files, %3d returns (before 2026-12-03 evening)\n", len(o.files), o.total())
	fmt.Fprintf(w, "  read once:                               %2d files, %3d returns\n", len(r.files), r.total())
	fmt.Fprintf(w, "  every call executed:                     %2d files, %3d returns\n", len(x.files), x.total())
	fmt.Fprintf(w, "  %-36s %8s %8s %8s %8s %8s\n", "returns per file (-: not visited)", "rule", "rule in", "no hooks", "read", "executed")
	for _, file := range x.files {
		fmt.Fprintf(w, "  %-36s %8s %8s %8d %8d %8d\n", file, b.returnsTo(file), l.returnsTo(file), h.returns[file], r.returns[file], x.returns[file])
	}
	if steps {
		fmt.Fprintln(w, "by the rule, to the backend's entry:", b.describe())
		fmt.Fprintln(w, "read once, without hooks:", h.describe())
		fmt.Fprintln(w, "every call executed:", x.describe())
	}
	return nil
}

// describe lists the steps of p, each file with the function the request
// is in when it gets there.
func (p path) describe() string {
	s := make([]string, len(p.steps))
	for i, file := range p.steps {
		s[i] = file + " (" + p.fns[i] + ")"
	}
	return strings.Join(s, " > ")
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
	// exited is closed once the daemon has been waited for, and waitErr
	// is then its exit: both waits below can see it.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = daemon.Wait(); close(exited) }()
	defer stopDaemon(daemon, mnt, exited)

	if err := waitMounted(mnt, exited, &waitErr); err != nil {
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

// waitMounted waits until mnt is a FUSE mount, or the daemon exits
// (exited closed, *waitErr its exit).
func waitMounted(mnt string, exited <-chan struct{}, waitErr *error) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if mounted(mnt) {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("lockfs mount exited before mounting: %v", *waitErr)
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
func stopDaemon(daemon *exec.Cmd, mnt string, exited <-chan struct{}) {
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
