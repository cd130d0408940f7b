package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrClusterUnusable is wrapped by Check's errors: the cluster cannot hold
// this host's locks as configured.
var ErrClusterUnusable = errors.New("etcd cluster unusable for locks")

// checkTimeout bounds each step of Check.
const checkTimeout = 5 * time.Second

// Check proves the cluster usable before a mount: some endpoint answers
// (with this TLS material and these credentials), and under the prefix a
// key can be written, read and deleted and a lease granted and revoked.
// Its error wraps ErrClusterUnusable and says which endpoint failed and
// what to fix. Endpoints that do not answer while others do are returned
// as warnings (a member may be down for maintenance).
func (b *Backend) Check(ctx context.Context) (warnings []string, err error) {
	var ok int
	var failed []string
	for _, ep := range b.cfg.Endpoints {
		sctx, cancel := context.WithTimeout(ctx, checkTimeout)
		_, err := b.cli.Status(sctx, ep)
		cancel()
		b.stats.requests.Add(1)
		if err == nil {
			ok++
			continue
		}
		failed = append(failed, fmt.Sprintf("%s: %s", ep, explain(b.cfg, err)))
	}
	if ok == 0 {
		return nil, fmt.Errorf("%w: no endpoint answers: %s", ErrClusterUnusable, strings.Join(failed, "; "))
	}
	probe := b.cfg.Prefix + "probe/" + b.cfg.HostID
	steps := []struct {
		what string
		f    func(ctx context.Context) error
	}{
		{"write " + probe, func(ctx context.Context) error {
			_, err := b.cli.Put(ctx, probe, "probe")
			return err
		}},
		{"read " + probe, func(ctx context.Context) error {
			_, err := b.cli.Get(ctx, probe)
			return err
		}},
		{"delete " + probe, func(ctx context.Context) error {
			_, err := b.cli.Delete(ctx, probe)
			return err
		}},
		{"grant and revoke a lease", func(ctx context.Context) error {
			l, err := b.cli.Grant(ctx, int64(b.cfg.TTL/time.Second))
			if err != nil {
				return err
			}
			_, err = b.cli.Revoke(ctx, l.ID)
			return err
		}},
	}
	for _, s := range steps {
		sctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), checkTimeout)
		err := s.f(sctx)
		cancel()
		b.stats.requests.Add(1)
		if err != nil {
			return failed, fmt.Errorf("%w: %s at %s: %s", ErrClusterUnusable, s.what, strings.Join(b.cfg.Endpoints, ","), explain(b.cfg, err))
		}
	}
	return failed, nil
}

// explain says what an error of the client means to the operator, and
// what to fix.
func explain(cfg Config, err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, rpctypes.ErrAuthFailed):
		return msg + " (wrong user or password: check --etcd-user and the password)"
	case errors.Is(err, rpctypes.ErrUserEmpty), errors.Is(err, rpctypes.ErrInvalidAuthToken):
		return msg + " (the cluster has authentication on: give --etcd-user)"
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return fmt.Sprintf("%s (user %q may not use the prefix %q: grant its role readwrite on it, e.g. "+
			"etcdctl role grant-permission ROLE --prefix=true readwrite %s)", msg, cfg.Username, cfg.Prefix, cfg.Prefix)
	case errors.Is(err, rpctypes.ErrNoLeader):
		return msg + " (the cluster has no leader: is a quorum of its members up?)"
	case strings.Contains(msg, "x509") || strings.Contains(msg, "tls:") || strings.Contains(msg, "certificate"):
		return msg + " (TLS failed: check --etcd-cacert, the CA that signed the server's certificate, and --etcd-cert/--etcd-key)"
	case strings.Contains(msg, "first record does not look like a TLS handshake") || strings.Contains(msg, "http2: frame too large"):
		return msg + " (TLS mismatch: an http:// endpoint speaks plain text, an https:// one TLS)"
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "connection refused") || strings.Contains(msg, "Unavailable"):
		return msg + " (no answer: check the URL, that etcd runs there and listens on that address, and the network)"
	}
	return msg
}
