package bench

import (
	"errors"
	"io"
	"time"
)

// Config sizes a run. DefaultConfig is `make bench`; SmokeConfig is the
// tiny run of TestSmoke.
type Config struct {
	// Reps is how many repetitions each comparison runs (at least 5 for a
	// real run: every figure is a min/median/max over them).
	Reps int

	// PairOps is the number of flock EX+UN pairs per repetition and side.
	PairOps int
	// CycleOps is the number of open+flock+close cycles per repetition.
	CycleOps int

	// HandoffProcs is the number of processes taking turns on one lock;
	// HandoffRounds how many grants each takes through lockfs, and
	// PollRounds how many through the polling loop; HandoffHold how long
	// each grant is held; PollInterval the polling loop's sleep.
	HandoffProcs  int
	HandoffRounds int
	PollRounds    int
	HandoffHold   time.Duration
	PollInterval  time.Duration

	// HeldLocks is the number of locks held for the RSS figure and the
	// "many held" side of the acquire comparison; HeldBase the number
	// held on the other side.
	HeldLocks int
	HeldBase  int

	// SeqBytes is the size of the sequential read/write file.
	SeqBytes int64

	// MetaOps is the number of create+stat+unlink cycles per repetition.
	MetaOps int

	// TreeFiles is the size of the tree the cold walks cover; TreeReps
	// the repetitions of each walk (each is long: fewer than Reps).
	TreeFiles int
	TreeReps  int

	// DisjointProcs are the process counts of the disjoint-lock throughput
	// runs, each DisjointDur long.
	DisjointProcs []int
	DisjointDur   time.Duration

	// GCSTTL is the lease TTL of the GCS runs (the refresh interval is the
	// backend's default, TTL/3); GCSHoldTTLs how many TTLs one lock is held
	// while refreshes are counted; GCSReps the number of repetitions of the
	// counts and of the takeover.
	GCSTTL      time.Duration
	GCSHoldTTLs int
	GCSReps     int
	// GCSHeld is the number of locks one host holds while its writes per
	// refresh interval are counted (gcs_writes_per_refresh_interval_1000_held).
	GCSHeld int

	// GCSFleetHosts hosts (each an engine and a backend with a client of
	// its own) churn their own locks under one shared parent for
	// GCSFleetDur, under GCS's per-object write limit.
	GCSFleetHosts int
	GCSFleetDur   time.Duration

	// GCSSimHosts hosts (each its own backend, session, client and
	// engine, default TTL), spread over GCSSimProcs processes, take
	// GCSSimLocks locks each within GCSSimSetup and hold them for
	// GCSSimDur while the requests reaching the emulator are counted; then
	// each releases and takes them again every GCSSimChurnEvery for
	// GCSSimChurnDur (make bench-scale).
	GCSSimHosts      int
	GCSSimLocks      int
	GCSSimProcs      int
	GCSSimSetup      time.Duration
	GCSSimDur        time.Duration
	GCSSimChurnDur   time.Duration
	GCSSimChurnEvery time.Duration

	// GCSHeldLocks locks are held through one `lockfs mount --backend gcs`
	// daemon (default TTL), by holder processes of at most
	// GCSHeldPerProc locks each, taken within GCSHeldSetup; GCSHeldPairs
	// EX+UN pairs per repetition time an acquire beside them, against a
	// daemon holding HeldBase.
	GCSHeldLocks   int
	GCSHeldPerProc int
	GCSHeldSetup   time.Duration
	GCSHeldPairs   int

	// FairHold is how long each hold of the busy mount's loops lasts while
	// the other mount's wait is timed (fair_cross_mount_wait_ms).
	FairHold time.Duration

	// Scale adds the scale measurements (ScaleMeasurements: gcssim, etcdsim,
	// gcsheld) to the run: make bench-scale.
	Scale bool

	// Only, if set, limits the run to the named measurements (see
	// Measurements).
	Only []string

	// WorkDir is where the run's temporary directory is made (default: the
	// system's temporary directory). It must be on a local disk: SOURCE
	// trees live there.
	WorkDir string

	// Log receives progress lines. Nil discards them.
	Log io.Writer

	// DrainWaiters is the number of waiters queued on one lock that
	// drain (the drain_10k keys).
	DrainWaiters int

	// Smoke marks a run whose figures mean nothing (tiny sizes).
	Smoke bool
}

// DefaultConfig is the configuration of `make bench`: about 5–8 minutes on
// a two-core VM.
func DefaultConfig() Config {
	return Config{
		Reps:          5,
		PairOps:       3000,
		CycleOps:      1500,
		HandoffProcs:  8,
		HandoffRounds: 40,
		PollRounds:    12,
		HandoffHold:   time.Millisecond,
		PollInterval:  50 * time.Millisecond,
		HeldLocks:     100000,
		HeldBase:      100,
		SeqBytes:      256 << 20,
		MetaOps:       2000,
		TreeFiles:     50000,
		TreeReps:      3,
		DisjointProcs: []int{1, 2, 4, 8},
		DisjointDur:   time.Second,
		GCSTTL:        3 * time.Second,
		GCSHoldTTLs:   1,
		GCSReps:       4,
		GCSHeld:       1000,

		GCSFleetHosts: 16,
		GCSFleetDur:   60 * time.Second,

		GCSSimHosts:      1000,
		GCSSimLocks:      100,
		GCSSimProcs:      8,
		GCSSimSetup:      25 * time.Minute,
		GCSSimDur:        2 * time.Minute,
		GCSSimChurnDur:   time.Minute,
		GCSSimChurnEvery: 5 * time.Second,

		GCSHeldLocks:   100000,
		GCSHeldPerProc: 15000,
		GCSHeldSetup:   12 * time.Minute,
		GCSHeldPairs:   3000,

		FairHold:     200 * time.Millisecond,
		DrainWaiters: 10000,
	}
}

// ScaleConfig is the configuration of `make bench-scale`: DefaultConfig
// with the scale measurements only (gcssim, etcdsim, gcsheld), under 45 minutes.
func ScaleConfig() Config {
	c := DefaultConfig()
	c.Scale = true
	c.Only = ScaleMeasurements
	return c
}

// SmokeConfig is every measurement at tiny sizes, one repetition: it
// proves the harness works, not how fast anything is.
func SmokeConfig() Config {
	return Config{
		Reps:          1,
		PairOps:       20,
		CycleOps:      10,
		HandoffProcs:  8,
		HandoffRounds: 2,
		PollRounds:    1,
		HandoffHold:   time.Millisecond,
		PollInterval:  50 * time.Millisecond,
		HeldLocks:     300,
		HeldBase:      10,
		SeqBytes:      1 << 20,
		MetaOps:       10,
		TreeFiles:     300,
		TreeReps:      1,
		DisjointProcs: []int{1, 2, 4, 8},
		DisjointDur:   50 * time.Millisecond,
		// A TTL that survives a loaded machine (make test beside
		// stress-ng on 2 cores): a heartbeat every 3.3 s, 9 s to land
		// one. At 1 s a heartbeat late by 900 ms lost the lease (ENOLCK,
		// "no heartbeat landed within TTL - margin"), which proves
		// nothing about the harness; the short TTL's figures are make
		// bench's (DefaultConfig, 3 s).
		GCSTTL:      10 * time.Second,
		GCSHoldTTLs: 1,
		GCSReps:     1,
		GCSHeld:     20,

		GCSFleetHosts: 3,
		GCSFleetDur:   time.Second,

		GCSSimHosts:      5,
		GCSSimLocks:      4,
		GCSSimProcs:      2,
		GCSSimSetup:      30 * time.Second,
		GCSSimDur:        2 * time.Second,
		GCSSimChurnDur:   2 * time.Second,
		GCSSimChurnEvery: time.Second,

		GCSHeldLocks:   300,
		GCSHeldPerProc: 100,
		GCSHeldSetup:   30 * time.Second,
		GCSHeldPairs:   10,
		FairHold:       50 * time.Millisecond,
		DrainWaiters:   50,
		Scale:          true,
		Smoke:          true,
	}
}

// Validate checks the sizes.
func (c Config) Validate() error {
	switch {
	case c.Reps < 1, c.PairOps < 1, c.CycleOps < 1, c.MetaOps < 1, c.GCSReps < 1, c.TreeFiles < 1, c.TreeReps < 1:
		return errors.New("bench: Reps, PairOps, CycleOps, MetaOps, TreeFiles, TreeReps and GCSReps must be positive")
	case c.HandoffProcs < 2 || c.HandoffRounds < 1 || c.PollRounds < 1:
		return errors.New("bench: a hand-off needs at least 2 processes and 1 round")
	case c.HeldLocks < 1 || c.HeldBase < 1 || c.HeldBase > c.HeldLocks:
		return errors.New("bench: need 1 <= HeldBase <= HeldLocks")
	case c.SeqBytes < 1<<20:
		return errors.New("bench: SeqBytes must be at least 1 MiB")
	case len(c.DisjointProcs) == 0 || c.DisjointDur <= 0:
		return errors.New("bench: DisjointProcs and DisjointDur are required")
	case c.GCSTTL < 100*time.Millisecond || c.GCSHoldTTLs < 1:
		return errors.New("bench: GCSTTL must be at least 100ms and GCSHoldTTLs positive")
	case c.GCSHeld < 1 || c.GCSFleetHosts < 1 || c.GCSFleetDur <= 0:
		return errors.New("bench: GCSHeld, GCSFleetHosts and GCSFleetDur must be positive")
	case c.GCSSimHosts < 1 || c.GCSSimLocks < 1 || c.GCSSimProcs < 1 || c.GCSSimSetup <= 0 || c.GCSSimDur <= 0 ||
		c.GCSSimChurnDur <= 0 || c.GCSSimChurnEvery <= 0:
		return errors.New("bench: GCSSimHosts, GCSSimLocks, GCSSimProcs, GCSSimSetup, GCSSimDur, GCSSimChurnDur and GCSSimChurnEvery must be positive")
	case c.GCSHeldLocks < c.HeldBase || c.GCSHeldPerProc < 1 || c.GCSHeldSetup <= 0 || c.GCSHeldPairs < 1:
		return errors.New("bench: need GCSHeldLocks >= HeldBase, and GCSHeldPerProc, GCSHeldSetup, GCSHeldPairs positive")
	case c.FairHold <= 0:
		return errors.New("bench: FairHold must be positive")
	}
	return nil
}
