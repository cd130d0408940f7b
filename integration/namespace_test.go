package integration

// The multi-host tests run against every shared backend from the same
// code: a namespace is what the daemons of one test share (a GCS
// emulator's bucket, or a prefix of a real etcd server), and hostsIn mounts
// two hosts in a new one.

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/etcdbackend/etcdtest"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
)

// multiHostBackends are the backends whose daemons share one namespace
// across hosts.
var multiHostBackends = []string{"gcs", "etcd"}

// namespace is a lock namespace that several daemons share.
type namespace interface {
	// mountArgs are the backend flags of lockfs mount for host h in it
	// (h.endpoint and h.bucket, if set, override the namespace's).
	mountArgs(h gcsHost) []string
	// lockArgs are the backend flags of a no-mount lockfs lock in it.
	lockArgs(ttl time.Duration) []string
	// lastRefresh returns when the session of host id was last refreshed
	// as the store saw it: for gcs its session object's last write; for
	// etcd the latest keep-alive its lease's remaining TTL allows (etcd
	// reports whole seconds, so this is at most 1s early). Call it after
	// the host stopped refreshing.
	lastRefresh(t *testing.T, id string) time.Time
}

// startNamespace starts the store of backend for t (needs FUSE too: it is
// checked first, so that a skip comes early).
func startNamespace(t *testing.T, backend string) namespace {
	t.Helper()
	requireFUSE(t)
	switch backend {
	case "gcs":
		return gcsNamespace{gcstest.Start(t)}
	case "etcd":
		return etcdNamespace{c: etcdtest.Start(t), prefix: "lockfs-test/"}
	}
	t.Fatalf("no namespace for backend %q", backend)
	return nil
}

// hostsIn starts a namespace of backend and mounts hosts A and B in it.
func hostsIn(t *testing.T, backend string, a, b gcsHost) (namespace, *Mount, *Mount) {
	t.Helper()
	ns := startNamespace(t, backend)
	return ns, mountIn(t, ns, a), mountIn(t, ns, b)
}

// mountIn mounts a fresh SOURCE (directories a/b, b, c) as host h of ns.
func mountIn(t *testing.T, ns namespace, h gcsHost) *Mount {
	t.Helper()
	return mountHost(t, h, ns.mountArgs(h))
}

type gcsNamespace struct{ emu *gcstest.Emulator }

func (n gcsNamespace) mountArgs(h gcsHost) []string {
	ep, bucket := h.endpoint, h.bucket
	if ep == "" {
		ep = n.emu.Endpoint()
	}
	if bucket == "" {
		bucket = n.emu.Bucket
	}
	return []string{"--backend", "gcs", "--gcs-bucket", bucket, "--gcs-endpoint", ep}
}

func (n gcsNamespace) lockArgs(ttl time.Duration) []string {
	return gcsLockArgs(n.emu.Endpoint(), n.emu.Bucket, ttl)
}

func (n gcsNamespace) lastRefresh(t *testing.T, id string) time.Time {
	return n.emu.LastHeartbeat(t, "", id)
}

type etcdNamespace struct {
	c      *etcdtest.Cluster
	prefix string
}

func (n etcdNamespace) mountArgs(h gcsHost) []string {
	ep := h.endpoint
	if ep == "" {
		ep = strings.Join(n.c.Endpoints(), ",")
	}
	return []string{"--backend", "etcd", "--etcd-endpoints", ep, "--etcd-prefix", n.prefix}
}

func (n etcdNamespace) lockArgs(ttl time.Duration) []string {
	return []string{"--backend", "etcd", "--etcd-endpoints", strings.Join(n.c.Endpoints(), ","),
		"--etcd-prefix", n.prefix, "--lease-ttl", ttl.String()}
}

// lastRefresh finds a claim key of host id and asks the server how long
// its lease has left.
func (n etcdNamespace) lastRefresh(t *testing.T, id string) time.Time {
	t.Helper()
	cli := n.c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, n.prefix+"claims/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("etcd: list claims: %v", err)
	}
	for _, kv := range resp.Kvs {
		var rec struct{ Host string }
		if json.Unmarshal(kv.Value, &rec) != nil || rec.Host != id {
			continue
		}
		now := time.Now()
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil || ttl.TTL < 0 {
			t.Fatalf("etcd: the lease of %s's claim %s: %v (ttl %v)", id, kv.Key, err, ttl)
		}
		return now.Add(time.Duration(ttl.TTL-ttl.GrantedTTL) * time.Second)
	}
	t.Fatalf("etcd: no claim of host %s under %s", id, n.prefix)
	return time.Time{}
}
