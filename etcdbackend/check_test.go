package etcdbackend_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/etcdbackend"
	"github.com/lockfs/lockfs/etcdbackend/etcdtest"
)

// Check refuses a cluster that cannot hold locks with a message naming the
// endpoint and the fix: endpoints that do not answer, wrong credentials, a
// prefix without permission, bad TLS material. Control: the same cluster
// with the right user and prefix passes.
func TestCheck(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := context.Background()
	check := func(cfg etcdbackend.Config) error {
		t.Helper()
		cfg.TTL = testTTL
		b, err := etcdbackend.New(cfg)
		if err != nil {
			return err
		}
		defer b.Close()
		_, err = b.Check(ctx)
		return err
	}
	want := func(err error, parts ...string) {
		t.Helper()
		if err == nil {
			t.Fatalf("check passed, want an error mentioning %q", parts)
		}
		for _, p := range parts {
			if !strings.Contains(err.Error(), p) {
				t.Errorf("error %q does not mention %q", err, p)
			}
		}
	}

	if err := check(etcdbackend.Config{Endpoints: c.Endpoints()}); err != nil {
		t.Fatalf("control: %v", err)
	}
	dead := "http://127.0.0.1:1"
	err := check(etcdbackend.Config{Endpoints: []string{dead}})
	want(err, dead, "no answer")
	if !errors.Is(err, etcdbackend.ErrClusterUnusable) {
		t.Fatalf("%v does not wrap ErrClusterUnusable", err)
	}
	// One dead endpoint among live ones is a warning, not a refusal.
	b, err := etcdbackend.New(etcdbackend.Config{Endpoints: append(c.Endpoints(), dead), TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	warns, err := b.Check(ctx)
	b.Close()
	if err != nil || len(warns) != 1 || !strings.Contains(warns[0], dead) {
		t.Fatalf("one dead endpoint of two: warnings %q, error %v", warns, err)
	}

	bad := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(bad, []byte("not a certificate"), 0o644)
	want(check(etcdbackend.Config{Endpoints: c.Endpoints(), CACert: bad}), "--etcd-cacert", bad)

	// Authentication on: root, and a user whose role may use "app/" only.
	cli := c.Client(t)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, step := range []func() error{
		func() error { _, err := cli.UserAdd(actx, "root", "rootpw"); return err },
		func() error { _, err := cli.UserGrantRole(actx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(actx, "app"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(actx, "app", "app/", clientv3.GetPrefixRangeEnd("app/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(actx, "alice", "alicepw"); return err },
		func() error { _, err := cli.UserGrantRole(actx, "alice", "app"); return err },
		func() error { _, err := cli.AuthEnable(actx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("setting up authentication: %v", err)
		}
	}
	if err := check(etcdbackend.Config{Endpoints: c.Endpoints(), Prefix: "app/", Username: "alice", Password: "alicepw"}); err != nil {
		t.Fatalf("control with authentication: %v", err)
	}
	want(check(etcdbackend.Config{Endpoints: c.Endpoints(), Prefix: "app/", Username: "alice", Password: "wrong"}),
		"wrong user or password")
	want(check(etcdbackend.Config{Endpoints: c.Endpoints(), Prefix: "other/", Username: "alice", Password: "alicepw"}),
		"may not use the prefix", "other/", "grant-permission")
}
