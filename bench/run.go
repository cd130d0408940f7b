package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Measurements are the names of the harness's measurements, in the order
// they run; Config.Only selects among them.
var Measurements = []string{"lockpair", "cycle", "disjoint", "handoff", "fair", "held", "seq", "meta", "tree", "gcs", "gcsfleet", "etcd", "drain"}

// ScaleMeasurements are the measurements of make bench-scale, run after
// Measurements when Config.Scale is set: 1,000 hosts × 100 locks on GCS
// (gcssim) and on etcd (etcdsim), and 100,000 locks held through a gcs
// daemon (gcsheld).
var ScaleMeasurements = []string{"gcssim", "etcdsim", "gcsheld"}

// runner is one run: its configuration, work directory, helper binaries,
// shared mounts and results.
type runner struct {
	cfg    Config
	modDir string
	work   string // the run's temporary directory
	binDir string
	logDir string
	log    io.Writer
	res    *Results

	// Mounts shared by several measurements, started on first use.
	src    string // SOURCE of the main lockfs mount
	lockfs *mount // lockfs over src
	noop   *mount // the no-op bazil daemon
	gofuse *mount // go-fuse's loopback over src
	// gofuseNoPT is go-fuse's loopback over src without FUSE passthrough
	// and lockfsNoPT lockfs over src with --passthrough=off (seq only,
	// started on first use).
	gofuseNoPT *mount
	lockfsNoPT *mount
	cleanup    []func()
}

// Run runs the measurements cfg selects and returns their results. It
// returns the results so far together with an error if a measurement
// failed; the keys of a failed measurement are missing.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, log: cfg.Log, res: newResults()}
	if r.log == nil {
		r.log = io.Discard
	}
	defer r.close()
	var err error
	if r.modDir, err = moduleDir(ctx); err != nil {
		return nil, err
	}
	if r.work, err = os.MkdirTemp(cfg.WorkDir, "lockfs-bench-"); err != nil {
		return nil, err
	}
	r.binDir = filepath.Join(r.work, "bin")
	r.logDir = filepath.Join(r.work, "log")
	for _, d := range []string{r.binDir, r.logDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
	}
	r.logf("building helpers into %s", r.binDir)
	if err := buildHelpers(ctx, r.modDir, r.binDir); err != nil {
		return nil, err
	}
	r.res.set("reps", float64(cfg.Reps))
	if cfg.Smoke {
		r.res.set("smoke", 1)
	}

	steps := map[string]func(context.Context) error{
		"lockpair": r.lockPair,
		"cycle":    r.cycles,
		"disjoint": r.disjoint,
		"handoff":  r.handoff,
		"fair":     r.fair,
		"held":     r.held,
		"seq":      r.seq,
		"meta":     r.meta,
		"tree":     r.tree,
		"gcs":      r.gcs,
		"gcsfleet": r.gcsFleet,
		"gcssim":   r.gcsSim,
		"etcdsim":  r.etcdSim,
		"gcsheld":  r.gcsHeld,
		"etcd":     r.etcd,
		"drain":    r.drain,
	}
	var errs []error
	names := Measurements
	if cfg.Scale {
		names = append(slices.Clip(names), ScaleMeasurements...)
	}
	for _, name := range names {
		if len(cfg.Only) > 0 && !slices.Contains(cfg.Only, name) {
			continue
		}
		start := time.Now()
		r.logf("%s: start", name)
		if err := steps[name](ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			r.logf("%s: FAILED after %v: %v", name, time.Since(start).Round(time.Millisecond), err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		r.logf("%s: done in %v", name, time.Since(start).Round(time.Millisecond))
	}
	return r.res, errors.Join(errs...)
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.log, "%s bench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// close stops everything the run started, last first, and removes the
// work directory.
func (r *runner) close() {
	for i := len(r.cleanup) - 1; i >= 0; i-- {
		r.cleanup[i]()
	}
	r.cleanup = nil
	if r.work != "" {
		// Never remove through a mount that is somehow still there. (One
		// read of the mount table: the work directory can hold 200,000
		// directories.)
		for _, m := range mountsUnder(r.work) {
			detach(m)
		}
		if len(mountsUnder(r.work)) == 0 {
			os.RemoveAll(r.work)
		}
	}
}

// atClose registers f to run when the run ends.
func (r *runner) atClose(f func()) { r.cleanup = append(r.cleanup, f) }

func (r *runner) bin(name string) string { return filepath.Join(r.binDir, name) }

// dir makes a directory (and its parents) under the work directory.
func (r *runner) dir(parts ...string) (string, error) {
	p := filepath.Join(append([]string{r.work}, parts...)...)
	return p, os.MkdirAll(p, 0o755)
}

// startLockfs mounts lockfs over src at a new mount point named name.
func (r *runner) startLockfs(ctx context.Context, name, src string, flags ...string) (*mount, error) {
	mnt, err := r.dir("mnt", name)
	if err != nil {
		return nil, err
	}
	args := append(append([]string{"mount", "--log-level", "warn"}, flags...), src, mnt)
	m, err := startMount(ctx, name, r.logDir, mnt, r.bin(binLockfs), args...)
	if err != nil {
		return nil, err
	}
	r.atClose(m.unmount)
	return m, nil
}

// mainMounts starts, on first use, the lockfs mount over the shared
// SOURCE, the no-op daemon and go-fuse's loopback over the same SOURCE.
func (r *runner) mainMounts(ctx context.Context) error {
	if r.lockfs != nil {
		return nil
	}
	var err error
	if r.src, err = r.dir("src"); err != nil {
		return err
	}
	if r.lockfs, err = r.startLockfs(ctx, "lockfs", r.src); err != nil {
		return err
	}
	noopMnt, err := r.dir("mnt", "noop")
	if err != nil {
		return err
	}
	if r.noop, err = startMount(ctx, "noopfs", r.logDir, noopMnt, r.bin(binNoop), noopMnt); err != nil {
		return err
	}
	r.atClose(r.noop.unmount)
	gofuseMnt, err := r.dir("mnt", "gofuse")
	if err != nil {
		return err
	}
	if r.gofuse, err = startMount(ctx, "loopback", r.logDir, gofuseMnt, r.bin(binLoopback), r.src, gofuseMnt); err != nil {
		return err
	}
	r.atClose(r.gofuse.unmount)
	return nil
}

// noPassthroughMounts starts, on first use, go-fuse's loopback over the
// shared SOURCE with -no-passthrough and lockfs over it with
// --passthrough=off: every read and write then reaches the daemon.
func (r *runner) noPassthroughMounts(ctx context.Context) error {
	if r.gofuseNoPT != nil {
		return nil
	}
	mnt, err := r.dir("mnt", "gofuse-nopt")
	if err != nil {
		return err
	}
	if r.gofuseNoPT, err = startMount(ctx, "loopback-nopt", r.logDir, mnt, r.bin(binLoopback), "-no-passthrough", r.src, mnt); err != nil {
		return err
	}
	r.atClose(r.gofuseNoPT.unmount)
	r.lockfsNoPT, err = r.startLockfs(ctx, "lockfs-nopt", r.src, "--passthrough=off")
	return err
}

// lockDir makes the directory rel (e.g. "a/b/c/d") in the shared SOURCE
// and returns the path of its .lock control file through the lockfs mount.
func (r *runner) lockDir(rel string) (string, error) {
	if err := os.MkdirAll(filepath.Join(r.src, rel), 0o755); err != nil {
		return "", err
	}
	return filepath.Join(r.lockfs.dir, rel, ".lock"), nil
}

// noopFile is the one file of the no-op daemon.
func (r *runner) noopFile() string { return filepath.Join(r.noop.dir, "f") }

// kernelFile makes an empty file on tmpfs (/dev/shm) for the kernel
// reference, removed at the end of the run.
func (r *runner) kernelFile(name string) (string, error) {
	f, err := os.CreateTemp(shmDir(r.work), "lockfs-bench-"+name+"-")
	if err != nil {
		return "", err
	}
	f.Close()
	r.atClose(func() { os.Remove(f.Name()) })
	return f.Name(), nil
}

// alternate runs a then b on even repetitions and b then a on odd ones.
func alternate(rep int, a, b func() error) error {
	first, second := a, b
	if rep%2 == 1 {
		first, second = b, a
	}
	if err := first(); err != nil {
		return err
	}
	return second()
}

func itoa(n int) string { return fmt.Sprint(n) }
