// Package gcstest runs a GCS emulator as a separate process on loopback for
// tests, and offers a fake monotonic clock for the gcs backend.
//
// Two emulators (Kind): GCSEmu, the default, is gcsemu
// (github.com/fullstorydev/emulators/storage, forked under third_party/
// with its listings started at their prefix) served by the command
// gcstest/gcsemulator: every request stays well under a millisecond with
// 100,000 objects stored. FakeGCSServer is fake-gcs-server, the version that
// go.mod pins with a tool line: its memory store slows down with every
// object stored, but it refuses a write into a missing bucket as GCS does,
// which gcsemu does not (it creates the bucket), so the bucket checks use it.
// TestEmulatorEnforcesPreconditions runs against both.
//
// Each binary is built once per machine into the Go build cache (about a
// minute cold on two cores) and reused by every test binary after that;
// concurrent test binaries serialise the build with a file lock. Under
// CI=true a failed build fails the test; elsewhere it skips it, saying why.
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
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
	"golang.org/x/sys/unix"
)

// Kind names a GCS emulator.
type Kind string

const (
	// GCSEmu is gcsemu, forked under third_party/, served by the command
	// gcstest/gcsemulator: the default.
	GCSEmu Kind = "gcsemu"
	// FakeGCSServer is fake-gcs-server, pinned by a tool line in go.mod.
	FakeGCSServer Kind = "fake-gcs-server"
)

// Kinds are the emulators the tests use.
var Kinds = []Kind{GCSEmu, FakeGCSServer}

// Module is the module path of fake-gcs-server, pinned by a tool line in
// go.mod.
const Module = "github.com/fsouza/fake-gcs-server"

// emuModule is the module of gcsemu, replaced by its fork under
// third_party/, and emuCommand the command that serves it.
const (
	emuModule  = "github.com/fullstorydev/emulators/storage"
	emuCommand = "github.com/lockfs/lockfs/gcsbackend/gcstest/gcsemulator"
)

// Args are the arguments that make the emulator of kind k serve an
// in-memory store on 127.0.0.1:port.
func (k Kind) Args(port string) []string {
	if k == FakeGCSServer {
		return []string{"-scheme", "http", "-host", "127.0.0.1", "-port", port,
			"-backend", "memory", "-public-host", "127.0.0.1:" + port, "-log-level", "warn"}
	}
	return []string{"-host", "127.0.0.1", "-port", port}
}

// buildTimeout bounds one build of an emulator.
const buildTimeout = 5 * time.Minute

// built is one emulator's build in this process: made once, by Binary.
type built struct {
	once sync.Once
	path string
	err  error
}

// binaries is Binary's cache, one entry per kind: a test binary builds (or
// finds in the Go build cache) each emulator once. Test support only: no
// product code calls Binary. The map itself is never written.
var binaries = map[Kind]*built{GCSEmu: {}, FakeGCSServer: {}}

// Binary returns the path of the emulator binary of kind k, building it on
// first use. A failed build fails t under CI=true and skips it otherwise.
func Binary(t testing.TB, k Kind) string {
	t.Helper()
	b := binaries[k]
	if b == nil {
		t.Fatalf("gcstest: no emulator %q", k)
	}
	b.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		b.path, b.err = Build(ctx, "", k)
	})
	if b.err != nil {
		testutil.Missing(t, "gcstest: cannot build the GCS emulator %s: %v", k, b.err)
	}
	return b.path
}

// Build returns the binary of the emulator of kind k for the module in
// modDir ("" for the current directory), building it once per machine
// into the Go build cache (GOCACHE/lockfs-KIND/KEY) under a lock, so that
// concurrent test binaries and the benchmark share one build. The key of
// fake-gcs-server is its pinned version; that of gcsemu a digest of the
// fork's and the command's sources, go.sum and the Go version.
func Build(ctx context.Context, modDir string, k Kind) (string, error) {
	var key, pkg string
	switch k {
	case FakeGCSServer:
		version, err := goIn(ctx, modDir, "list", "-m", "-f", "{{.Version}}", Module)
		if err != nil {
			return "", fmt.Errorf("find the pinned version (is there a tool line in go.mod?): %w", err)
		}
		key, pkg = version, Module
	case GCSEmu:
		var err error
		if key, err = sourceKey(ctx, modDir); err != nil {
			return "", err
		}
		pkg = emuCommand
	default:
		return "", fmt.Errorf("no emulator %q", k)
	}
	cache, err := goIn(ctx, modDir, "env", "GOCACHE")
	if err != nil || cache == "" || cache == "off" {
		return "", fmt.Errorf("no Go build cache to keep the emulator in (GOCACHE=%q): %v", cache, err)
	}
	dir := filepath.Join(cache, "lockfs-"+string(k), key)
	bin := filepath.Join(dir, string(k))
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
	tmp := filepath.Join(dir, fmt.Sprintf("%s.tmp%d", k, os.Getpid()))
	defer os.Remove(tmp)
	if _, err := goIn(ctx, modDir, "build", "-o", tmp, pkg); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// sourceKey digests what the gcsemu command is built from: the fork's and
// the command's files, the main module's go.sum and the Go version.
func sourceKey(ctx context.Context, modDir string) (string, error) {
	fork, err := goIn(ctx, modDir, "list", "-m", "-f", "{{.Dir}}", emuModule)
	if err != nil {
		return "", fmt.Errorf("find gcsemu's fork (is there a replace in go.mod?): %w", err)
	}
	cmdDir, err := goIn(ctx, modDir, "list", "-f", "{{.Dir}}", emuCommand)
	if err != nil {
		return "", err
	}
	gomod, err := goIn(ctx, modDir, "env", "GOMOD")
	if err != nil {
		return "", err
	}
	version, err := goIn(ctx, modDir, "env", "GOVERSION")
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintln(h, version)
	add := func(p string) error {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", p, len(b))
		h.Write(b)
		return nil
	}
	if err := add(strings.TrimSuffix(gomod, ".mod") + ".sum"); err != nil {
		return "", err
	}
	for _, root := range []string{fork, cmdDir} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || strings.HasSuffix(p, "_test.go") {
				return err
			}
			return add(p)
		})
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
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
