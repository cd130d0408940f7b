package main

import (
	"errors"
	"reflect"
	"testing"
)

func TestOptionsToFlags(t *testing.T) {
	flags, logFile, err := optionsToFlags("rw,_netdev,nofail,x-systemd.automount,backend=gcs,gcs_bucket=b,lease-ttl=10s,allow_other,log-file=/tmp/x.log")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--backend=gcs", "--gcs-bucket=b", "--lease-ttl=10s", "--allow-other"}
	if !reflect.DeepEqual(flags, want) || logFile != "/tmp/x.log" {
		t.Fatalf("got %q, %q; want %q", flags, logFile, want)
	}
	for _, bad := range []string{"no_such", "backend", "allow_other=1", "ro", "log-file="} {
		if _, _, err := optionsToFlags(bad); !errors.Is(err, errUsage) {
			t.Errorf("optionsToFlags(%q): %v, want a usage error", bad, err)
		}
	}
}
