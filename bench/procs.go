package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/buildflags"
	"github.com/lockfs/lockfs/internal/procinfo"
)

// The helper binaries, built by the harness from these packages.
const (
	binLoadgen  = "loadgen"
	binNoop     = "noopfs"
	binLoopback = "loopback"
	binLockfs   = "lockfs"
)

var helperPkgs = []string{
	"./bench/internal/loadgen",
	"./bench/internal/noopfs",
	"./bench/internal/loopback",
	"./cmd/lockfs",
}

// moduleDir returns the directory of the lockfs module (where go.mod is).
func moduleDir(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the lockfs module (go env GOMOD is empty)")
	}
	return filepath.Dir(mod), nil
}

// buildHelpers builds the helper binaries into dir (normal builds: no race
// detector, whatever the harness itself was built with).
func buildHelpers(ctx context.Context, modDir, dir string) error {
	args := append([]string{"build", "-tags", buildflags.Tags, "-o", dir + "/"}, helperPkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = modDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", strings.Join(helperPkgs, " "), err, out)
	}
	return nil
}

// loadgenEnv is the environment of every helper the harness runs: Go's
// asynchronous preemption off, so that the runtime's SIGURG does not
// interrupt FUSE requests in flight (each would cost the daemon an
// INTERRUPT request that a C program would not send).
func loadgenEnv() []string { return append(os.Environ(), "GODEBUG=asyncpreemptoff=1") }

// runJSON runs a helper to completion and decodes its one JSON object of
// output into v.
func runJSON(ctx context.Context, v any, bin string, args ...string) error {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = loadgenEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("%s %s: bad output %q: %w", filepath.Base(bin), strings.Join(args, " "), out, err)
	}
	return nil
}

// nsPerOp runs a loadgen command that reports ns_per_op.
func (r *runner) nsPerOp(ctx context.Context, args ...string) (float64, error) {
	var out struct {
		NsPerOp float64 `json:"ns_per_op"`
	}
	if err := runJSON(ctx, &out, r.bin(binLoadgen), args...); err != nil {
		return 0, err
	}
	return out.NsPerOp, nil
}

// background is a helper process that runs until the harness stops it.
type background struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once reaped
	err  error         // Wait's result, once done is closed
	log  string        // file with its standard error
}

// startBackground starts bin with args; its standard error goes to a log
// file in logDir. It dies with the harness (Pdeathsig).
func startBackground(name, logDir, bin string, args ...string) (*background, error) {
	logPath := filepath.Join(logDir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	b := &background{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { b.err = cmd.Wait(); close(b.done) }()
	return b, nil
}

// pid returns the process id.
func (b *background) pid() int { return b.cmd.Process.Pid }

// stop sends SIGTERM, waits up to grace, then SIGKILL, and reaps.
func (b *background) stop(grace time.Duration) {
	select {
	case <-b.done:
		return
	default:
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
		return
	case <-time.After(grace):
	}
	_ = b.cmd.Process.Kill()
	<-b.done
}

// logTail returns the last lines of the process's output.
func (b *background) logTail() string {
	data, _ := os.ReadFile(b.log)
	if len(data) > 2048 {
		data = data[len(data)-2048:]
	}
	return strings.TrimSpace(string(data))
}

// mount is a FUSE daemon serving a mount point.
type mount struct {
	*background
	dir string // the mount point
}

// fuseSuperMagic is statfs's f_type of a FUSE mount.
const fuseSuperMagic = 0x65735546

// startMount starts a daemon that mounts at dir, and waits until the
// mount answers. The caller must call unmount, whatever happens.
func startMount(ctx context.Context, name, logDir, dir, bin string, args ...string) (*mount, error) {
	b, err := startBackground(name, logDir, bin, args...)
	if err != nil {
		return nil, err
	}
	m := &mount{background: b, dir: dir}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err == nil && st.Type == fuseSuperMagic && isMountPoint(dir) {
			return m, nil
		}
		select {
		case <-b.done:
			m.unmount()
			return nil, fmt.Errorf("%s exited before mounting %s: %v: %s", name, dir, b.err, b.logTail())
		case <-ctx.Done():
			m.unmount()
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			m.unmount()
			return nil, fmt.Errorf("%s did not mount %s within 20s: %s", name, dir, b.logTail())
		}
	}
}

// unmount stops the daemon (SIGTERM, then SIGKILL) and detaches the mount
// point if it is still mounted. It is safe to call twice.
func (m *mount) unmount() {
	m.stop(10 * time.Second)
	detach(m.dir)
}

// detach runs `fusermount3 -uz dir` while dir is a mount point.
func detach(dir string) {
	for i := 0; i < 3 && isMountPoint(dir); i++ {
		_ = exec.Command("fusermount3", "-uz", dir).Run()
	}
}

// isMountPoint reports whether dir is a mount point, from
// /proc/self/mountinfo.
func isMountPoint(dir string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMount(fields[4]) == dir {
			return true
		}
	}
	return false
}

// mountsUnder returns the mount points below dir, from one read of
// /proc/self/mountinfo.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			if p := unescapeMount(fields[4]); strings.HasPrefix(p, dir+"/") {
				out = append(out, p)
			}
		}
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(byte(c))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cpuMeter starts counting the CPU time, user and system, that process pid
// uses; the function it returns gives the seconds used since, and false if
// either reading failed.
func cpuMeter(pid int) func() (float64, bool) {
	start, err0 := procinfo.CPUTime(procinfo.Root, pid)
	return func() (float64, bool) {
		now, err := procinfo.CPUTime(procinfo.Root, pid)
		if err0 != nil || err != nil {
			return 0, false
		}
		return (now - start).Seconds(), true
	}
}

// rssMB returns the resident set size of process pid in MiB.
func rssMB(pid int) (float64, error) {
	return statusMB(pid, "VmRSS:")
}

// statusMB returns the field of /proc/PID/status (in kB there) in MiB.
func statusMB(pid int, field string) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			var kb float64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%f kB", &kb); err != nil {
				return 0, err
			}
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// raiseNofile raises this process's RLIMIT_NOFILE (soft and hard, as far
// as fs.nr_open allows for root) so that its children (the lockfs daemon,
// the lock holder) can keep n descriptors open.
func raiseNofile(n uint64) error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= n && lim.Max >= n {
		return nil
	}
	want := unix.Rlimit{Cur: max(lim.Cur, n), Max: max(lim.Max, n)}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &want); err != nil {
		return fmt.Errorf("raise RLIMIT_NOFILE to %d (from %d/%d): %w", n, lim.Cur, lim.Max, err)
	}
	return nil
}
