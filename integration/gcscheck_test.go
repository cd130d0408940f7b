package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend/gcstest"
)

// `lockfs mount --backend gcs` on a bucket that does not exist exits
// non-zero with a message naming the bucket and saying what to fix, and
// mounts nothing. Control: the same command on the emulator's bucket, with
// a bare endpoint (no /storage/v1/), mounts and serves a lock. On
// fake-gcs-server: gcsemu creates a missing bucket on the first write.
func TestGCSMountRefusesMissingBucket(t *testing.T) {
	requireFUSE(t)
	emu := gcstest.StartKind(t, gcstest.FakeGCSServer)
	base := t.TempDir()
	src, mnt := filepath.Join(base, "src"), filepath.Join(base, "mnt")
	for _, d := range []string{src, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r := lockfs(t, 60*time.Second, "mount", "--backend", "gcs", "--gcs-bucket", "no-such-bucket",
		"--gcs-endpoint", emu.URL, "--lease-ttl", gcsTTL.String(), src, mnt)
	t.Logf("missing bucket: exit %d after %v: %s", r.code, r.took.Round(time.Millisecond), strings.TrimSpace(r.stderr))
	if r.code == 0 || r.timedOut || !strings.Contains(r.stderr, `bucket "no-such-bucket" does not exist`) ||
		!strings.Contains(r.stderr, "create it") {
		t.Errorf("want a non-zero exit naming the missing bucket, got %v", r)
	}
	if isMounted(mnt) {
		runQuiet("fusermount3", "-uz", mnt)
		t.Fatal("something was mounted anyway")
	}

	m := mountGCS(t, gcsHost{id: "check-control", endpoint: emu.URL, bucket: emu.Bucket})
	expectCode(t, "flock -n on the good bucket", flockN(t, m.path(".lock")), 0)
}
