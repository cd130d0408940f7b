package gcstest

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
)

// DefaultBucket is the bucket Start creates.
const DefaultBucket = "lockfs-test"

// startTimeout bounds the wait for the emulator's health check.
const startTimeout = 15 * time.Second

// Emulator is an emulator process serving an in-memory store on a loopback
// port.
type Emulator struct {
	// Kind is which emulator it is.
	Kind Kind
	// URL is the emulator's base URL, "http://127.0.0.1:PORT".
	URL string
	// Bucket is a bucket created at start.
	Bucket string

	cmd  *exec.Cmd
	done chan struct{} // closed when the process has been reaped
	log  string        // path of the emulator's output
}

// Endpoint returns the JSON API endpoint of a GCS emulator whose base URL is
// base, as the gcs backend's Endpoint and option.WithEndpoint want it.
func Endpoint(base string) string { return base + "/storage/v1/" }

// Endpoint returns the emulator's JSON API endpoint.
func (e *Emulator) Endpoint() string { return Endpoint(e.URL) }

// Start builds (once per machine) and starts the default emulator (GCSEmu)
// on a free loopback port, waits until it answers its health check,
// creates DefaultBucket, and stops it when t ends.
func Start(t testing.TB) *Emulator {
	t.Helper()
	return StartKind(t, GCSEmu)
}

// StartKind is Start with the emulator of kind k.
func StartKind(t testing.TB, k Kind) *Emulator {
	t.Helper()
	bin := Binary(t, k)
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		e, err := start(bin, k, t.TempDir())
		if err != nil {
			lastErr = err
			continue // most likely the port was taken meanwhile
		}
		t.Cleanup(func() {
			if err := e.Stop(); err != nil {
				t.Errorf("gcstest: stopping the emulator: %v", err)
			}
			if t.Failed() {
				if b, err := os.ReadFile(e.log); err == nil && len(b) > 0 {
					t.Logf("emulator output (last 4 KiB):\n%s", tail(b, 4096))
				}
			}
		})
		e.Bucket = DefaultBucket
		e.CreateBucket(t, DefaultBucket)
		return e
	}
	t.Fatalf("gcstest: cannot start the emulator: %v", lastErr)
	return nil
}

func start(bin string, k Kind, dir string) (*Emulator, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := strconv.Itoa(port)
	logPath := filepath.Join(dir, string(k)+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, k.Args(p)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a terminal's Ctrl-C reaches the test
	// first; it dies with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	e := &Emulator{Kind: k, URL: "http://127.0.0.1:" + p, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { cmd.Wait(); close(e.done) }()

	deadline := time.Now().Add(startTimeout)
	hc := &http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get(e.URL + "/_internal/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return e, nil
			}
		}
		select {
		case <-e.done:
			b, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("emulator exited at start: %s", tail(b, 1024))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			e.Stop()
			return nil, fmt.Errorf("emulator did not answer its health check within %v (last error %v)", startTimeout, err)
		}
	}
}

// Stop kills the emulator and waits for it to exit. It may be called twice.
func (e *Emulator) Stop() error {
	select {
	case <-e.done:
		return nil
	default:
	}
	if err := e.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-e.done:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("emulator did not exit after SIGKILL")
	}
}

// Client returns a storage client for the emulator, closed when t ends. Its
// requests go to endpoint if given (a fault proxy in front of the emulator),
// else to the emulator itself.
func (e *Emulator) Client(t testing.TB, endpoint ...string) *storage.Client {
	t.Helper()
	ep := e.Endpoint()
	if len(endpoint) > 0 {
		ep = endpoint[0]
	}
	c, err := storage.NewClient(context.Background(), option.WithEndpoint(ep),
		option.WithoutAuthentication(), storage.WithJSONReads())
	if err != nil {
		t.Fatalf("gcstest: storage client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// LastHeartbeat returns when the emulator last wrote the session object of
// the gcs backend host hostID under prefix (sessions/HOSTID.RANDOM): the
// host's last heartbeat, as long as nobody declared the session dead since.
// The emulator runs on this machine, so its clock is the test's.
func (e *Emulator) LastHeartbeat(t testing.TB, prefix, hostID string) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	it := e.Client(t).Bucket(e.Bucket).Objects(ctx, &storage.Query{Prefix: prefix + "sessions/" + hostID + "."})
	var last time.Time
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			t.Fatalf("gcstest: list sessions of %s: %v", hostID, err)
		}
		if a.Updated.After(last) {
			last = a.Updated
		}
	}
	if last.IsZero() {
		t.Fatalf("gcstest: no session object of %s under %q", hostID, prefix)
	}
	return last
}

// CreateBucket creates a bucket in the emulator.
func (e *Emulator) CreateBucket(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Client(t).Bucket(name).Create(ctx, "lockfs-test", nil); err != nil {
		t.Fatalf("gcstest: create bucket %q: %v", name, err)
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// SendCRC32C makes w send the CRC32C of data, which it must upload: gcsemu
// reports no CRC32C of its own but the one sent, and the client checks
// that against what it computed (GCS recommends sending it anyway; the
// gcs backend does).
func SendCRC32C(w *storage.Writer, data []byte) {
	w.CRC32C, w.SendCRC32C = crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)), true
}
