package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockfs/lockfs/etcdbackend"
)

// etcdTakeoverTTL is the holder host's TTL in the takeover (its lock-delay
// is the default, the TTL).
const etcdTakeoverTTL = 3 * time.Second

// etcdHolder is the holder host of the takeover, a helper process: an etcd
// backend and engine (LOCKFS_BENCH_ETCD: endpoints, prefix, host id, TTL,
// lock) holding the lock until killed.
func etcdHolder() error {
	f := strings.Split(os.Getenv("LOCKFS_BENCH_ETCD"), "\x1f")
	if len(f) != 5 {
		return fmt.Errorf("bad LOCKFS_BENCH_ETCD %q", os.Getenv("LOCKFS_BENCH_ETCD"))
	}
	ttl, err := time.ParseDuration(f[3])
	if err != nil {
		return err
	}
	b, err := etcdbackend.New(etcdbackend.Config{Endpoints: strings.Split(f[0], ","), Prefix: f[1], HostID: f[2], TTL: ttl})
	if err != nil {
		return err
	}
	return holdUntilKilled(b, f[4])
}

// takeover: a holder host (a helper process) holds gcsLock; a host in this
// process waits for it; the holder is killed with SIGKILL. The server
// expires the holder's session lease TTL + lock-delay after its last
// keep-alive: that moment is read from the server, by asking the lease's
// remaining TTL (whole seconds, rounded down) every few ms after the kill
// until it ticks down, which places the expiry within about one ask. The
// time from the expiry to the waiter's grant is recorded, and from the
// kill.
func (e *etcdRun) takeover(ctx context.Context) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	for rep := range min(e.r.cfg.GCSReps, 3) { // each about 7 s: make bench stays under 12 min
		e.seq++
		prefix := fmt.Sprintf("bench-takeover%d/", e.seq)
		id := fmt.Sprintf("bench-etcd-holder-%d", e.seq)
		holder, err := e.r.startHolderHost(ctx, id, helperEtcdHolder,
			"LOCKFS_BENCH_ETCD="+strings.Join([]string{strings.Join(e.eps, ","), prefix, id, etcdTakeoverTTL.String(), gcsLock}, "\x1f"))
		if err != nil {
			return err
		}
		err = e.takeoverOnce(ctx, cli, holder, prefix, rep)
		holder.stop(time.Second)
		if err != nil {
			return err
		}
	}
	return nil
}

func (e *etcdRun) takeoverOnce(ctx context.Context, cli *clientv3.Client, holder *background, prefix string, rep int) error {
	b, err := e.backend(prefix)
	if err != nil {
		return err
	}
	defer b.Close()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	granted := make(chan time.Time, 1)
	failed := make(chan error, 1)
	go func() {
		l, err := etcdClaim(wctx, b, gcsLock, true)
		if err != nil {
			failed <- err
			return
		}
		granted <- time.Now()
		l.Release(context.Background())
	}()
	// The waiter waits, and the holder has sent a keep-alive (every TTL/3).
	time.Sleep(etcdTakeoverTTL / 2)
	lease, err := holderLease(ctx, cli, prefix)
	if err != nil {
		return err
	}
	ttl, err := cli.TimeToLive(ctx, lease)
	if err != nil {
		return err
	}
	select {
	case <-granted:
		return errors.New("etcd takeover: the waiter was granted while the holder lived")
	case err := <-failed:
		return err
	default:
	}
	killed := time.Now()
	if err := holder.cmd.Process.Kill(); err != nil {
		return err
	}
	expiry, err := leaseExpiry(ctx, cli, lease)
	if err != nil {
		return err
	}
	select {
	case t := <-granted:
		grantedTTL := time.Duration(ttl.GrantedTTL) * time.Second
		e.takeoverS = append(e.takeoverS, t.Sub(expiry).Seconds())
		e.takeoverKillS = append(e.takeoverKillS, (t.Sub(killed) - grantedTTL).Seconds())
		e.r.logf("etcd takeover %d: granted %.3fs after the lease's expiry, %.3fs after the kill (lease %v)",
			rep, t.Sub(expiry).Seconds(), t.Sub(killed).Seconds(), grantedTTL)
		return nil
	case err := <-failed:
		return err
	}
}

// holderLease returns the session lease of the one claim key under prefix
// (its last element is the lease id in hex).
func holderLease(ctx context.Context, cli *clientv3.Client, prefix string) (clientv3.LeaseID, error) {
	resp, err := cli.Get(ctx, prefix+"claims/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) != 1 {
		return 0, fmt.Errorf("etcd takeover: %d claim keys under %s, want the holder's one", len(resp.Kvs), prefix)
	}
	k := string(resp.Kvs[0].Key)
	id, err := strconv.ParseInt(k[strings.LastIndexByte(k, '/')+1:], 16, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd takeover: claim key %q: %w", k, err)
	}
	return clientv3.LeaseID(id), nil
}

// leaseExpiry returns when the server will expire lease, which no longer
// gets keep-alives: its remaining TTL, in whole seconds rounded down, is
// asked until it ticks down from k to k-1, which happens k seconds before
// the expiry; the tick is placed between the two asks' midpoints.
func leaseExpiry(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID) (time.Time, error) {
	ask := func() (int64, time.Time, error) {
		t0 := time.Now()
		r, err := cli.TimeToLive(ctx, lease)
		if err != nil {
			return 0, t0, err
		}
		return r.TTL, t0.Add(time.Since(t0) / 2), nil
	}
	k, prev, err := ask()
	if err != nil {
		return time.Time{}, err
	}
	if k <= 0 {
		return time.Time{}, fmt.Errorf("etcd takeover: the lease had %ds left at the kill", k)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
		n, at, err := ask()
		if err != nil {
			return time.Time{}, err
		}
		if n != k {
			return prev.Add(at.Sub(prev) / 2).Add(time.Duration(k) * time.Second), nil
		}
		prev = at
	}
	return time.Time{}, errors.New("etcd takeover: the lease's remaining TTL did not tick down")
}
