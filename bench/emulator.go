package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/lockfs/lockfs/gcsbackend/faultproxy"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
)

// benchEmulator is the emulator of the GCS measurements: gcsemu, whose
// requests stay well under a millisecond with 100,000 objects stored
// (gcsbackend/gcstest says why not fake-gcs-server).
const benchEmulator = gcstest.GCSEmu

// emulatorBinary returns the emulator binary, built once per machine by
// gcsbackend/gcstest (shared cache and build lock).
func emulatorBinary(ctx context.Context, modDir string) (string, error) {
	return gcstest.Build(ctx, modDir, benchEmulator)
}

// emulator is a running emulator with an in-memory store.
type emulator struct {
	*background
	url string // http://127.0.0.1:PORT
}

// startEmulator starts the emulator on a free loopback port and creates
// bucket. The caller must stop it.
func startEmulator(ctx context.Context, bin, logDir, bucket string) (*emulator, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	b, err := startBackground(string(benchEmulator), logDir, bin, benchEmulator.Args(port)...)
	if err != nil {
		return nil, err
	}
	e := &emulator{background: b, url: "http://127.0.0.1:" + port}
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := hc.Get(e.url + "/_internal/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-b.done:
			return nil, fmt.Errorf("emulator exited at start: %s", b.logTail())
		case <-ctx.Done():
			e.stop(time.Second)
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			e.stop(time.Second)
			return nil, fmt.Errorf("emulator did not answer its health check within 15s: %v", err)
		}
	}
	body := fmt.Sprintf(`{"name":%q}`, bucket)
	resp, err := hc.Post(e.url+"/storage/v1/b?project=lockfs-bench", "application/json", strings.NewReader(body))
	if err != nil {
		e.stop(time.Second)
		return nil, fmt.Errorf("create bucket: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		e.stop(time.Second)
		return nil, fmt.Errorf("create bucket: %s", resp.Status)
	}
	return e, nil
}

// countingProxy is a faultproxy in front of the emulator: it counts the
// requests it receives by kind (reads: content and metadata reads and
// lists; writes: uploads, patches, deletes) and by object, and can enforce
// GCS's per-object write limit and add latency (faultproxy.Limits).
type countingProxy struct {
	*faultproxy.Proxy
}

// requestCounts is a snapshot of a proxy's counters.
type requestCounts struct{ Reads, Writes int64 }

func (c requestCounts) sub(d requestCounts) requestCounts {
	return requestCounts{c.Reads - d.Reads, c.Writes - d.Writes}
}

func (c requestCounts) total() int64 { return c.Reads + c.Writes }

func startCountingProxy(target string) (*countingProxy, error) {
	p, err := faultproxy.New(target, 1, faultproxy.Faults{})
	if err != nil {
		return nil, err
	}
	return &countingProxy{p}, nil
}

func (p *countingProxy) counts() requestCounts {
	k := p.Kinds()
	return requestCounts{
		Reads:  k[faultproxy.KindRead] + k[faultproxy.KindMetadata] + k[faultproxy.KindList],
		Writes: k[faultproxy.KindWrite],
	}
}

// endpoint is the JSON API endpoint through the proxy, as
// gcsbackend.Config.Endpoint wants it.
func (p *countingProxy) endpoint() string { return gcstest.Endpoint(p.URL) }

func (p *countingProxy) close() { p.Close() }
