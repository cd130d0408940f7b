package etcdbackend_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/etcdbackend/etcdtest"
)

// testTTL is the session TTL of the tests: short, so that losses and
// takeovers happen within seconds.
const testTTL = 3 * time.Second

var hostSeq atomic.Uint64

func testLogger(t testing.TB) logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(testWriter{t})
	l.SetLevel(logrus.WarnLevel)
	return l
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// newBackend returns a backend of a new host on c under the test's own
// prefix, closed when t ends (closing it twice is harmless).
func newBackend(t testing.TB, c *etcdtest.Cluster, mod ...func(*etcdbackend.Config)) *etcdbackend.Backend {
	t.Helper()
	cfg := etcdbackend.Config{
		Endpoints: c.Endpoints(),
		Prefix:    "test/" + t.Name() + "/",
		TTL:       testTTL,
		HostID:    fmt.Sprintf("host%d", hostSeq.Add(1)),
		Logger:    testLogger(t),
	}
	for _, m := range mod {
		m(&cfg)
	}
	b, err := etcdbackend.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}
