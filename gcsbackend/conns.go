package gcsbackend

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/option"
	"google.golang.org/api/option/internaloption"
	raw "google.golang.org/api/storage/v1"
	htransport "google.golang.org/api/transport/http"
)

// conns is the one connection pool a backend's two GCS clients share,
// and that its Close empties. Left to themselves the storage client and
// the JSON API client each made a pool of their own, and a pool's idle
// connections outlived Close by 90 s: the transports the API wraps
// around a pool (authentication, headers) do not pass
// CloseIdleConnections on. A host that ended kept up to 200 connections
// open at GCS; 1,000 simulated hosts ending at once kept 43,000 open at
// the emulator, which ran out of descriptors and lost the holds of the
// hosts still closing (docs/BENCHMARKS.md, "At scale").
type conns struct {
	client *http.Client
	// pool is nil when the API's own pool is used (client certificates:
	// see newConns); then Close leaves its idle connections to time out.
	pool *http.Transport
}

// newClients makes the backend's two GCS clients over one pool: the
// storage client, and the JSON API's generated client that sends every
// claim's requests.
func newClients(ctx context.Context, cfg Config) (*storage.Client, *raw.Service, *conns, error) {
	// No OpenTelemetry wrapper around the HTTP transport: lockfs installs
	// no provider, so its spans and metrics went nowhere, while their
	// attributes cost about a tenth of what each request allocates.
	opts := []option.ClientOption{option.WithTelemetryDisabled()}
	if cfg.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(cfg.Endpoint), option.WithoutAuthentication())
	} else if v := os.Getenv("STORAGE_EMULATOR_HOST"); v != "" {
		return nil, nil, nil, fmt.Errorf("gcsbackend: STORAGE_EMULATOR_HOST=%q is set: the GCS client would silently drop "+
			"authentication and talk to it; unset it, or name the emulator explicitly as the endpoint", v)
	}
	conns, err := newConns(ctx, opts)
	if err != nil {
		return nil, nil, nil, err
	}
	// The client carries authentication; the endpoint options stay, for
	// the clients' request URLs.
	opts = append(opts, option.WithHTTPClient(conns.client))
	svc, err := raw.NewService(ctx, opts...)
	if err != nil {
		conns.close()
		return nil, nil, nil, fmt.Errorf("gcsbackend: storage JSON API client: %w", err)
	}
	client, err := storage.NewClient(ctx, append(opts, storage.WithJSONReads())...)
	if err != nil {
		conns.close()
		return nil, nil, nil, fmt.Errorf("gcsbackend: storage client: %w", err)
	}
	// Every retry is ours: counted, bounded, resolved by reading back.
	client.SetRetry(storage.WithPolicy(storage.RetryNever))
	return client, svc, conns, nil
}

// newConns makes the shared client: authentication (or none, for an
// endpoint of its own) as the JSON API client would set it up, over a
// pool this backend owns.
func newConns(ctx context.Context, opts []option.ClientOption) (*conns, error) {
	c := &conns{}
	var base http.RoundTripper
	if useClientCert, _ := strconv.ParseBool(os.Getenv("GOOGLE_API_USE_CLIENT_CERTIFICATE")); !useClientCert {
		// The API's own base pool, but ours: it clones the default
		// transport the same way. With client certificates (mTLS) the API
		// must build the pool, since only it knows their source.
		c.pool = http.DefaultTransport.(*http.Transport).Clone()
		c.pool.MaxIdleConnsPerHost = 100
		// A connection GCS stopped answering on is found and dropped in
		// ~30 s, as the API's pool does (its HTTP/2 ReadIdleTimeout).
		c.pool.HTTP2 = &http.HTTP2Config{SendPingTimeout: 31 * time.Second}
		base = c.pool
	}
	rt, err := htransport.NewTransport(ctx, base, append([]option.ClientOption{
		// The scopes the JSON API client asks for (storage/v1 NewService).
		internaloption.WithDefaultScopes(
			"https://www.googleapis.com/auth/cloud-platform",
			"https://www.googleapis.com/auth/cloud-platform.read-only",
			"https://www.googleapis.com/auth/devstorage.full_control",
			"https://www.googleapis.com/auth/devstorage.read_only",
			"https://www.googleapis.com/auth/devstorage.read_write",
		),
		internaloption.EnableNewAuthLibrary(),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("gcsbackend: HTTP transport: %w", err)
	}
	c.client = &http.Client{Transport: rt}
	return c, nil
}

// close drops the pool's idle connections; call it once no request is in
// flight. A connection still in use closes when its request ends.
func (c *conns) close() {
	if c.pool != nil {
		c.pool.CloseIdleConnections()
	}
}
