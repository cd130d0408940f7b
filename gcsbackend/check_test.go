package gcsbackend_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/faultproxy"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// An emulator endpoint is accepted with or without /storage/v1/; any other
// path is kept, and a URL without a host is refused.
func TestEndpointNormalised(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:4443":              "http://127.0.0.1:4443/storage/v1/",
		"http://127.0.0.1:4443/":             "http://127.0.0.1:4443/storage/v1/",
		"http://127.0.0.1:4443/storage/v1":   "http://127.0.0.1:4443/storage/v1/",
		"http://127.0.0.1:4443/storage/v1/":  "http://127.0.0.1:4443/storage/v1/",
		"https://gcs.example:8443/api/":      "https://gcs.example:8443/api/",
		"http://127.0.0.1:4443/a/storage/v1": "http://127.0.0.1:4443/a/storage/v1",
	} {
		cfg := gcsbackend.Config{Bucket: "b", Endpoint: in}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", in, err)
		}
		b, err := gcsbackend.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Config().Endpoint; got != want {
			t.Errorf("endpoint %q became %q, want %q", in, got, want)
		}
		b.Close()
	}
	for _, bad := range []string{"127.0.0.1:4443", "ftp://h/", "http://"} {
		if err := (gcsbackend.Config{Bucket: "b", Endpoint: bad}).Validate(); err == nil || !strings.Contains(err.Error(), "Endpoint") {
			t.Errorf("endpoint %q: %v, want an error about the Endpoint", bad, err)
		}
	}
}

// checkErr runs Check on a backend configured by mod and returns its error
// and how long it took.
func checkErr(t *testing.T, emu *gcstest.Emulator, mod func(*gcsbackend.Config)) (*gcsbackend.Backend, error, time.Duration) {
	t.Helper()
	b := newBackend(t, emu, mod)
	start := time.Now()
	err := b.Check(ctxT(t, time.Minute))
	return b, err, time.Since(start)
}

// A bare emulator endpoint passes the check and serves locks; the probe is
// cleaned up. Control: a wrong path is refused, naming the endpoint. On
// fake-gcs-server: gcsemu answers JSON API paths under any prefix.
func TestCheckBareEndpoint(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.StartKind(t, gcstest.FakeGCSServer)
	b, err, _ := checkErr(t, emu, func(c *gcsbackend.Config) { c.Endpoint = emu.URL })
	if err != nil {
		t.Fatalf("bare endpoint %s: %v", emu.URL, err)
	}
	l, err := b.Claim(ctxT(t, 10*time.Second), dirLock("x"), lockmgr.Exclusive, false)
	if err != nil {
		t.Fatalf("claim through the bare endpoint: %v", err)
	}
	if err := l.Release(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	it := emu.Client(t).Bucket(emu.Bucket).Objects(context.Background(), &storage.Query{Prefix: b.Config().Prefix + "probe/"})
	if o, err := it.Next(); err != iterator.Done {
		t.Errorf("probe left behind: %v, %v", o, err)
	}

	wrong := emu.URL + "/wrong/path/"
	_, err, _ = checkErr(t, emu, func(c *gcsbackend.Config) { c.Endpoint = wrong })
	if !errors.Is(err, gcsbackend.ErrBucketUnusable) || !strings.Contains(err.Error(), wrong) ||
		!strings.Contains(err.Error(), "not a GCS JSON API endpoint") {
		t.Errorf("wrong path: %v; want ErrBucketUnusable naming %s as not a JSON API endpoint", err, wrong)
	}
}

// A missing bucket is refused at once with a message that names it and
// says to create it. Control: the bucket, once created, passes. On
// fake-gcs-server: gcsemu creates a missing bucket on the first write.
func TestCheckMissingBucket(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.StartKind(t, gcstest.FakeGCSServer)
	const name = "no-such-bucket"
	_, err, _ := checkErr(t, emu, func(c *gcsbackend.Config) { c.Bucket = name })
	if !errors.Is(err, gcsbackend.ErrBucketUnusable) || !strings.Contains(err.Error(), `bucket "`+name+`" does not exist`) ||
		!strings.Contains(err.Error(), "create it") {
		t.Fatalf("missing bucket: %v", err)
	}
	emu.CreateBucket(t, name)
	if _, err, _ := checkErr(t, emu, func(c *gcsbackend.Config) { c.Bucket = name }); err != nil {
		t.Fatalf("control, the bucket created: %v", err)
	}
}

// A bucket that answers writes with 403 is refused, the message naming the
// IAM role it needs. Control: the same proxy without the fault passes.
func TestCheckUnwritableBucket(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	px, err := faultproxy.New(emu.URL, 7, faultproxy.Faults{Forbidden: 1, WritesOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	endpoint := func(c *gcsbackend.Config) { c.Endpoint = gcstest.Endpoint(px.URL) }
	_, err, _ = checkErr(t, emu, endpoint)
	if !errors.Is(err, gcsbackend.ErrBucketUnusable) || !strings.Contains(err.Error(), "permission denied") ||
		!strings.Contains(err.Error(), "roles/storage.objectUser") || !strings.Contains(err.Error(), emu.Bucket) ||
		!strings.Contains(err.Error(), "storage.objects.get, list, create and delete") {
		t.Fatalf("unwritable bucket: %v", err)
	}
	if s := px.Stats(); s.Forbidden != 1 {
		t.Errorf("%d writes answered 403, want 1 (a 403 is definite, not retried)", s.Forbidden)
	}
	px.SetFaults(faultproxy.Faults{})
	if _, err, _ := checkErr(t, emu, endpoint); err != nil {
		t.Fatalf("control, writes allowed: %v", err)
	}
}

// An endpoint that refuses connections is refused at once (nothing
// listens there: it waited out UnavailableAfter, 10 s by default), with a
// message naming the endpoint, saying so and to check the address. The
// bound is generous against UnavailableAfter (2 minutes here): only a check
// that waits it out fails it.
func TestCheckRefusedFailsFast(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	const after = 2 * time.Minute
	ep := "http://127.0.0.1:1/storage/v1/"
	_, err, took := checkErr(t, emu, func(c *gcsbackend.Config) { c.Endpoint, c.UnavailableAfter = ep, after })
	t.Logf("%s: %v after %v", ep, err, took)
	if !errors.Is(err, gcsbackend.ErrBucketUnusable) || !strings.Contains(err.Error(), "nothing listens at endpoint "+ep) ||
		!strings.Contains(err.Error(), "check the address") {
		t.Errorf("%s: %v; want ErrBucketUnusable saying nothing listens there", ep, err)
	}
	if took > after/2 {
		t.Errorf("%s: refused after %v, want at once (UnavailableAfter is %v)", ep, took, after)
	}
}

// An endpoint that refuses connections, and one that never answers, are
// refused after UnavailableAfter at the latest, with a message naming the
// endpoint and saying to check the address. The bound is generous: only a
// check that hangs fails it.
func TestCheckUnreachable(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	px, err := faultproxy.New(emu.URL, 8, faultproxy.Faults{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	px.SetBlackhole(true)
	const after = 2 * time.Second
	for _, ep := range []string{"http://127.0.0.1:1/storage/v1/", gcstest.Endpoint(px.URL)} {
		_, err, took := checkErr(t, emu, func(c *gcsbackend.Config) { c.Endpoint, c.UnavailableAfter = ep, after })
		t.Logf("%s: %v after %v", ep, err, took)
		if !errors.Is(err, gcsbackend.ErrBucketUnusable) || !strings.Contains(err.Error(), ep) ||
			!strings.Contains(err.Error(), "check the address") {
			t.Errorf("%s: %v; want ErrBucketUnusable naming it and the address", ep, err)
		}
		if took > after+10*time.Second {
			t.Errorf("%s: refused after %v; UnavailableAfter is %v", ep, took, after)
		}
	}
	px.SetBlackhole(false)
	if _, err, _ := checkErr(t, emu, func(c *gcsbackend.Config) { c.Endpoint = gcstest.Endpoint(px.URL) }); err != nil {
		t.Fatalf("control, the proxy answering: %v", err)
	}
}
