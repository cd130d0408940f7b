package gcsbackend_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// TestMain doubles as the "other host" of the crash tests: with
// GCSBACKEND_HELPER=hold the test binary claims the locks named in
// GCSBACKEND_LOCKS exclusively, says "held", and runs until it is killed.
func TestMain(m *testing.M) {
	if os.Getenv("GCSBACKEND_HELPER") == "hold" {
		if err := holdUntilKilled(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

func holdUntilKilled() error {
	ttl, err := time.ParseDuration(os.Getenv("GCSBACKEND_TTL"))
	if err != nil {
		return err
	}
	b, err := gcsbackend.New(context.Background(), gcsbackend.Config{
		Bucket:   os.Getenv("GCSBACKEND_BUCKET"),
		Prefix:   os.Getenv("GCSBACKEND_PREFIX"),
		Endpoint: os.Getenv("GCSBACKEND_ENDPOINT"),
		TTL:      ttl,
		HostID:   "crashing-host",
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var first lockmgr.Lease
	var token uint64
	for _, p := range strings.Split(os.Getenv("GCSBACKEND_LOCKS"), ",") {
		l, err := b.Claim(ctx, lockmgr.LockID{Path: p, Kind: lockmgr.KindDir}, lockmgr.Exclusive, false)
		if err != nil {
			return err
		}
		if first == nil {
			first = l
			if token, err = l.NextToken(ctx); err != nil {
				return err
			}
		}
	}
	fmt.Printf("held %d\n", token)
	// Say when the first lease is lost (after a SIGSTOP, say).
	<-first.Done()
	fmt.Printf("lost %v\n", first.Err())
	select {}
}
