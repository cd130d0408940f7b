// Package gcstest runs the GCS emulator (fake-gcs-server, the version that
// go.mod pins with a tool line) as a separate process on loopback for tests,
// and offers a fake monotonic clock for the gcs backend.
//
// The emulator binary is built once per machine into the Go build cache
// (about a minute cold on two cores) and reused by every test binary after
// that; concurrent test binaries serialise the build with a file lock.
// Under CI=true a failed build fails the test; elsewhere it skips it, saying
// why.
//
// A test of another package uses it like this:
//
//	emu := gcstest.Start(t) // stopped when t ends
//	b, err := gcsbackend.New(ctx, gcsbackend.Config{
//		Bucket: emu.Bucket, Endpoint: emu.Endpoint(), TTL: 3 * time.Second})
//
// and a daemon under test gets the same endpoint with --gcs-endpoint. Put a
// faultproxy between them with faultproxy.New(emu.URL, seed, faults) and
// gcstest.Endpoint(proxy.URL).
package gcstest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Module is the module path of the emulator, pinned by a tool line in go.mod.
const Module = "github.com/fsouza/fake-gcs-server"

// buildTimeout bounds one build of the emulator.
const buildTimeout = 5 * time.Minute

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary returns the path of the emulator binary, building it on first use.
// A failed build fails t under CI=true and skips it otherwise.
func Binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		binPath, binErr = Build(ctx, "")
	})
	if binErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("gcstest: cannot build the GCS emulator %s: %v", Module, binErr)
		}
		t.Skipf("gcstest: cannot build the GCS emulator %s (set CI=true to fail instead): %v", Module, binErr)
	}
	return binPath
}

// Build returns the emulator binary for the version pinned in the go.mod of
// the module in modDir ("" for the current directory), building it once per
// machine into the Go build cache (GOCACHE/lockfs-fakegcs/VERSION) under a
// lock, so that concurrent test binaries and the benchmark share one build.
func Build(ctx context.Context, modDir string) (string, error) {
	version, err := goIn(ctx, modDir, "list", "-m", "-f", "{{.Version}}", Module)
	if err != nil {
		return "", fmt.Errorf("find the pinned version (is there a tool line in go.mod?): %w", err)
	}
	cache, err := goIn(ctx, modDir, "env", "GOCACHE")
	if err != nil || cache == "" || cache == "off" {
		return "", fmt.Errorf("no Go build cache to keep the emulator in (GOCACHE=%q): %v", cache, err)
	}
	dir := filepath.Join(cache, "lockfs-fakegcs", version)
	bin := filepath.Join(dir, "fake-gcs-server")
	if isExecutable(bin) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Serialise builds between test binaries running at once.
	lock, err := os.OpenFile(filepath.Join(dir, "build.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := flockWait(ctx, lock); err != nil {
		return "", fmt.Errorf("wait for another build: %w", err)
	}
	if isExecutable(bin) {
		return bin, nil
	}
	tmp := filepath.Join(dir, fmt.Sprintf("fake-gcs-server.tmp%d", os.Getpid()))
	defer os.Remove(tmp)
	if _, err := goIn(ctx, modDir, "build", "-o", tmp, Module); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// flockWait takes an exclusive flock on f, polling so that ctx can end it.
func flockWait(ctx context.Context, f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// goIn runs the go command in dir ("" for the current directory) and
// returns its trimmed standard output.
func goIn(ctx context.Context, dir string, args ...string) (string, error) {
	gocmd, err := exec.LookPath("go")
	if err != nil {
		// go test sets GOROOT for the test binary even if go is not in PATH.
		gocmd = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	cmd := exec.CommandContext(ctx, gocmd, args...)
	cmd.Dir = dir
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(out.String()), nil
}
