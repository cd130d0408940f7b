package bench

// A holder host in a process of its own (this binary, re-executed), for
// the measurements that kill or pause a host.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// The holder host: this same binary, re-executed with helperEnv set.

const (
	helperEnv        = "LOCKFS_BENCH_HELPER"
	helperGCSHolder  = "gcs-holder"
	helperEtcdHolder = "etcd-holder"
)

// startGCSHolder re-executes this binary as a holder host and waits until
// it holds lock exclusively.
func (r *runner) startGCSHolder(ctx context.Context, cfg gcsbackend.Config, lock string) (*background, error) {
	return r.startHolderHost(ctx, cfg.HostID, helperGCSHolder,
		"LOCKFS_BENCH_GCS="+strings.Join([]string{cfg.Endpoint, cfg.Bucket, cfg.Prefix, cfg.HostID, cfg.TTL.String(), lock}, "\x1f"))
}

// startHolderHost re-executes this binary as the holder host helper (with
// env, its configuration) and waits until it says it holds its lock.
func (r *runner) startHolderHost(ctx context.Context, name, helper, env string) (*background, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-test.run=^$") // harmless if self is a test binary
	cmd.Env = append(os.Environ(), helperEnv+"="+helper, env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(r.logDir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b := &background{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
		io.Copy(io.Discard, stdout)
		b.err = cmd.Wait()
		close(b.done)
	}()
	select {
	case s := <-line:
		if !strings.HasPrefix(s, "held") {
			b.stop(time.Second)
			return nil, fmt.Errorf("%s: %q: %s", helper, s, b.logTail())
		}
		return b, nil
	case <-time.After(time.Minute):
		b.stop(time.Second)
		return nil, fmt.Errorf("%s did not take the lock within a minute: %s", helper, b.logTail())
	case <-ctx.Done():
		b.stop(time.Second)
		return nil, ctx.Err()
	}
}

// HelperMain runs the harness's helper processes: a binary that calls Run
// must call HelperMain first thing in main (or TestMain), because Run
// re-executes that binary as a GCS holder host. It returns at once when
// the process is not a helper.
func HelperMain() {
	switch os.Getenv(helperEnv) {
	case "":
		return
	case helperGCSHolder:
		err := gcsHolder()
		fmt.Fprintln(os.Stderr, "gcs holder:", err)
		os.Exit(1)
	case helperEtcdHolder:
		err := etcdHolder()
		fmt.Fprintln(os.Stderr, "etcd holder:", err)
		os.Exit(1)
	case helperSimHosts:
		if err := simHosts(); err != nil {
			fmt.Fprintln(os.Stderr, "sim hosts:", err)
			os.Exit(1)
		}
		os.Exit(0)
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", helperEnv, os.Getenv(helperEnv))
		os.Exit(2)
	}
}

// gcsHolder takes the lock exclusively through its own backend and engine,
// prints "held", and holds it until killed.
func gcsHolder() error {
	f := strings.Split(os.Getenv("LOCKFS_BENCH_GCS"), "\x1f")
	if len(f) != 6 {
		return fmt.Errorf("bad LOCKFS_BENCH_GCS %q", os.Getenv("LOCKFS_BENCH_GCS"))
	}
	ttl, err := time.ParseDuration(f[4])
	if err != nil {
		return err
	}
	b, err := gcsbackend.New(context.Background(), gcsbackend.Config{Endpoint: f[0], Bucket: f[1], Prefix: f[2], HostID: f[3], TTL: ttl})
	if err != nil {
		return err
	}
	return holdUntilKilled(b, f[5])
}

// holdUntilKilled takes lock exclusively through an engine over b, prints
// "held", and holds it until the process is killed.
func holdUntilKilled(b lockmgr.Backend, lock string) error {
	e, err := engineOver(b, nil)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.Acquire(actx, gcsRequest(lock, 1, false)); err != nil {
		return err
	}
	fmt.Println("held")
	select {} // until SIGKILL
}
