package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/buildflags"
	"github.com/lockfs/lockfs/internal/testutil"
)

// lockfsBin is the lockfs binary under test, built by TestMain.
var lockfsBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "lockfs-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	lockfsBin = filepath.Join(dir, "lockfs")
	args := []string{"build", "-tags", buildflags.Tags, "-o", lockfsBin}
	if os.Getenv("LOCKFS_DAEMON_RACE") != "0" {
		// The daemon runs with the race detector: a data race it hits during
		// a test fails that test (see Mount.cleanup).
		args = append(args, "-race")
	}
	args = append(args, "./cmd/lockfs")
	cmd := exec.Command(goTool(), args...)
	cmd.Dir = ".." // the module root
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "integration: building lockfs: %v\n%s", err, out)
		return 1
	}
	// No goroutine of the test binary (process readers, proxies, clients)
	// may outlive the tests: each test ends what it started in its cleanup.
	before := testutil.SnapshotGoroutines()
	code := m.Run()
	if left := before.Leaked("net/http.(*persistConn)"); len(left) > 0 && code == 0 {
		fmt.Fprintf(os.Stderr, "integration: %d goroutines outlived the tests:\n\n%s\n", len(left), strings.Join(left, "\n\n"))
		return 1
	}
	return code
}

// daemonEnv is the environment of lockfs processes: the race detector's
// default one-second sleep at exit would slow every stop.
func daemonEnv() []string {
	return append(os.Environ(), "GORACE=atexit_sleep_ms=100")
}

// goTool returns the go command that runs these tests.
func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// require fails (in CI) or skips the test if a tool or device is missing.
func require(t *testing.T, tools ...string) {
	t.Helper()
	pkgs := map[string]string{
		"fusermount3": "fuse3", "flock": "util-linux", "setpriv": "util-linux",
		"python3": "python3", "sqlite3": "sqlite3", "stress-ng": "stress-ng", "promtool": "prometheus", "systemd-analyze": "systemd", "make": "make", "dpkg": "dpkg", "dpkg-deb": "dpkg",
	}
	var missing []string
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, fmt.Sprintf("%s (apt-get install -y %s)", tool, pkgs[tool]))
		}
	}
	if len(missing) > 0 {
		testutil.Missing(t, "missing %s; `make deps` installs them", strings.Join(missing, ", "))
	}
}

// requireFUSE fails (in CI) or skips the test if FUSE cannot be used.
func requireFUSE(t *testing.T) {
	t.Helper()
	require(t, "fusermount3", "flock")
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testutil.Missing(t, "/dev/fuse is missing (%v): modprobe fuse, or run the container with --device /dev/fuse", err)
	}
}

// requireRoot skips or fails a test that must run as root.
func requireRoot(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t, "this test")
}

// mountConfig is what mount options change.
type mountConfig struct {
	args  []string         // extra flags for lockfs mount
	setup func(src string) // runs on SOURCE before mounting
	open  func(dir string) // runs on the test's temp dir (permissions)
	src   string           // use this SOURCE instead of a fresh one
	env   []string         // extra environment of the daemon
}

// mountOpt configures mount.
type mountOpt func(*mountConfig)

// withArgs passes extra flags to lockfs mount.
func withArgs(args ...string) mountOpt {
	return func(c *mountConfig) { c.args = append(c.args, args...) }
}

// withSetup prepares SOURCE before mounting.
func withSetup(f func(src string)) mountOpt {
	return func(c *mountConfig) { c.setup = f }
}

// withSource mounts an existing SOURCE.
func withSource(src string) mountOpt {
	return func(c *mountConfig) { c.src = src }
}

// withEnv adds VAR=value entries to the daemon's environment.
func withEnv(env ...string) mountOpt {
	return func(c *mountConfig) { c.env = append(c.env, env...) }
}

// withWorldTraversable makes the test's directories traversable by every
// user (for tests that run programs as nobody).
func withWorldTraversable() mountOpt {
	return func(c *mountConfig) {
		c.open = func(dir string) {
			for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
				os.Chmod(d, 0o755)
			}
		}
	}
}

// Mount is a running lockfs mount.
type Mount struct {
	t   *testing.T
	Src string // SOURCE
	Mnt string // MOUNTPOINT
	Log string // the daemon's log file

	cmd    *exec.Cmd
	exited chan struct{} // closed when the daemon has exited
	state  *os.ProcessState

	stopOnce sync.Once
	stopCode int
}

// mount starts `lockfs mount SRC MNT` over a fresh SOURCE holding the
// directories a/b, b and c, and waits until the mount is in /proc/mounts.
// Cleanup stops the daemon with SIGTERM, waits for it, and always runs
// fusermount3 -uz, whatever happened.
func mount(t *testing.T, opts ...mountOpt) *Mount {
	t.Helper()
	requireFUSE(t)
	var cfg mountConfig
	for _, o := range opts {
		o(&cfg)
	}
	base := t.TempDir()
	if cfg.open != nil {
		cfg.open(base)
	}
	src := cfg.src
	if src == "" {
		src = filepath.Join(base, "src")
		for _, d := range []string{"a/b", "b", "c"} {
			if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(src, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.setup != nil {
		cfg.setup(src)
	}
	mnt := filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	m := startMountEnv(t, src, mnt, cfg.env, cfg.args...)
	m.waitReady()
	return m
}

// startMount starts the daemon without waiting for the mount.
func startMount(t *testing.T, src, mnt string, args ...string) *Mount {
	t.Helper()
	return startMountEnv(t, src, mnt, nil, args...)
}

// startMountEnv is startMount with extra environment for the daemon.
func startMountEnv(t *testing.T, src, mnt string, env []string, args ...string) *Mount {
	t.Helper()
	logPath := filepath.Join(filepath.Dir(mnt), fmt.Sprintf("lockfs-%d.log", time.Now().UnixNano()))
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	level := os.Getenv("LOCKFS_TEST_LOG_LEVEL")
	if level == "" {
		level = "debug"
	}
	argv := append([]string{"mount", "--log-level", level}, args...)
	argv = append(argv, src, mnt)
	cmd := exec.Command(lockfsBin, argv...)
	cmd.Env = append(daemonEnv(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	logf.Close()
	m := &Mount{t: t, Src: src, Mnt: mnt, Log: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		m.state = cmd.ProcessState
		close(m.exited)
	}()
	t.Cleanup(m.cleanup)
	return m
}

// waitReady waits until the mount shows in /proc/mounts and answers: a
// stale mount left at the mountpoint by a killed daemon is in /proc/mounts
// too, but fails statfs.
func (m *Mount) waitReady() {
	m.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !isMounted(m.Mnt) || !isLive(m.Mnt) {
		select {
		case <-m.exited:
			m.t.Fatalf("lockfs mount exited before mounting (%v); log:\n%s", m.state, m.logText())
		default:
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("%s not mounted after 20s; log:\n%s", m.Mnt, m.logText())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// isMounted reports whether /proc/mounts has a FUSE mount at mnt.
func isMounted(mnt string) bool {
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[1] == mnt && (f[2] == "fuse.lockfs" || f[2] == "fuse") {
			return true
		}
	}
	return false
}

// isLive reports whether a FUSE daemon answers at mnt: statfs, which the
// kernel never answers from a cache, reaches a FUSE filesystem. A stale
// mount fails it with ENOTCONN, a bare directory is not FUSE.
func isLive(mnt string) bool {
	const fuseSuperMagic = 0x65735546
	var st syscall.Statfs_t
	return syscall.Statfs(mnt, &st) == nil && st.Type == fuseSuperMagic
}

// Pid is the daemon's process id.
func (m *Mount) Pid() int { return m.cmd.Process.Pid }

// logText returns the daemon's log so far.
func (m *Mount) logText() string {
	b, _ := os.ReadFile(m.Log)
	return string(b)
}

// stop sends SIGTERM and waits for the daemon to exit; it returns the exit
// code, or -1 if the daemon had to be killed after timeout.
func (m *Mount) stop(timeout time.Duration) int {
	m.stopOnce.Do(func() {
		m.cmd.Process.Signal(syscall.SIGCONT) // in case a test stopped it
		m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.exited:
			m.stopCode = m.state.ExitCode()
		case <-time.After(timeout):
			m.t.Errorf("lockfs did not exit within %v of SIGTERM; killing it", timeout)
			m.cmd.Process.Kill()
			<-m.exited
			m.stopCode = -1
		}
	})
	return m.stopCode
}

// waitExit waits for the daemon to exit by itself and returns its code.
func (m *Mount) waitExit(timeout time.Duration) (int, bool) {
	select {
	case <-m.exited:
		return m.state.ExitCode(), true
	case <-time.After(timeout):
		return 0, false
	}
}

func (m *Mount) cleanup() {
	m.stop(20 * time.Second)
	// Always: a daemon that died leaves a stale mount behind.
	exec.Command("fusermount3", "-uz", m.Mnt).Run()
	log := m.logText()
	if strings.Contains(log, "WARNING: DATA RACE") {
		m.t.Errorf("the lockfs daemon hit a data race; log:\n%s", log)
		return
	}
	if m.t.Failed() {
		m.t.Logf("lockfs log (%s):\n%s", m.Log, tail(log, 200))
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines before)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// path joins elements under the mountpoint.
func (m *Mount) path(elem ...string) string {
	return filepath.Join(append([]string{m.Mnt}, elem...)...)
}

// srcPath joins elements under SOURCE.
func (m *Mount) srcPath(elem ...string) string {
	return filepath.Join(append([]string{m.Src}, elem...)...)
}

// result is how a command ended.
type result struct {
	code     int // exit code; -1 if killed by a signal or the timeout
	stdout   string
	stderr   string
	timedOut bool
	took     time.Duration
}

func (r result) String() string {
	s := fmt.Sprintf("exit %d after %v", r.code, r.took.Round(time.Millisecond))
	if r.timedOut {
		s += " (TIMED OUT, killed)"
	}
	if r.stdout != "" {
		s += fmt.Sprintf(", stdout %q", r.stdout)
	}
	if r.stderr != "" {
		s += fmt.Sprintf(", stderr %q", r.stderr)
	}
	return s
}

// command returns a command in its own process group, so that a timeout
// kills it with all its children.
func command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run runs a command to completion or timeout.
func run(t *testing.T, timeout time.Duration, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return runCmd(t, ctx, command(ctx, name, args...))
}

// runCmd runs cmd, made by command with ctx, to completion or timeout.
func runCmd(t *testing.T, ctx context.Context, cmd *exec.Cmd) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		r.code, r.timedOut = -1, true
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("%q: %v", cmd.Args, err)
	}
	return r
}

// sh runs a shell script.
func sh(t *testing.T, timeout time.Duration, script string) result {
	t.Helper()
	return run(t, timeout, "sh", "-c", script)
}

// proc is a background process started by a test: a testutil.Child, with
// its stderr kept for the test's messages.
type proc struct {
	t      *testing.T
	c      *testutil.Child
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  <-chan string // stdout, line by line; closed at EOF
	stderr *syncBuffer
	done   <-chan struct{} // closed when the process has been reaped
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start starts a background process (a holder) in its own session, and so
// its own process group: no signal meant for it or its group reaches the
// test runner. Cleanup kills the group and reaps it (testutil.StartChild).
func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	c := testutil.StartChild(t, cmd)
	return &proc{t: t, c: c, cmd: cmd, stdin: c.Stdin, lines: c.Lines, stderr: stderr, done: c.Done}
}

// waitLine waits for a line of stdout equal to want.
func (p *proc) waitLine(want string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				<-p.done
				p.t.Fatalf("%q exited (%v) before printing %q; stderr %q", p.cmd.Args, p.c.Err, want, p.stderr.String())
			}
			if line == want {
				return
			}
		case <-deadline:
			p.t.Fatalf("%q did not print %q within %v; stderr %q", p.cmd.Args, want, timeout, p.stderr.String())
		}
	}
}

// nextLine returns the next line of stdout, or "" with ok false at EOF or timeout.
func (p *proc) nextLine(timeout time.Duration) (string, bool) {
	select {
	case line, ok := <-p.lines:
		return line, ok
	case <-time.After(timeout):
		return "", false
	}
}

// kill SIGKILLs the process group and waits for the process to be reaped
// (testutil.Child.Kill); one not reaped is named with its state.
func (p *proc) kill() {
	p.c.Kill()
	select {
	case <-p.done:
	default:
		p.t.Errorf("%q not reaped after SIGKILL (stuck in state %c?)", p.cmd.Args, procState(p.cmd.Process.Pid))
	}
}

// wait waits for the process to exit by itself and returns its exit code
// (-1 if killed by a signal); ok is false on timeout.
func (p *proc) wait(timeout time.Duration) (code int, ok bool) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), true
	case <-time.After(timeout):
		return 0, false
	}
}

// pid is the process id.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// startPython runs a python3 script with arguments in the background.
func startPython(t *testing.T, script string, args ...string) *proc {
	t.Helper()
	return start(t, "python3", append([]string{"-c", script}, args...)...)
}

// holder starts `flock FLAGS PATH sh -c 'echo held; exec sleep 1000'` and
// waits until it holds the lock.
func holder(t *testing.T, path string, flags ...string) *proc {
	t.Helper()
	args := append(append([]string{}, flags...), path, "sh", "-c", "echo held; exec sleep 1000")
	p := start(t, "flock", args...)
	p.waitLine("held", 15*time.Second)
	return p
}

// procState returns the state letter of /proc/PID/stat (R, S, D, Z...), or
// 0 if the process is gone.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// flockN runs `flock -n FLAGS PATH true` and returns its result.
func flockN(t *testing.T, path string, flags ...string) result {
	t.Helper()
	args := append([]string{"-n"}, flags...)
	args = append(args, path, "true")
	return run(t, 10*time.Second, "flock", args...)
}

// expectCode fails the test unless r ended with code.
func expectCode(t *testing.T, what string, r result, code int) {
	t.Helper()
	if r.timedOut || r.code != code {
		t.Errorf("%s: want exit %d, got %v", what, code, r)
	}
}
