// Package integration tests lockfs end to end: each test builds nothing
// itself but runs the lockfs binary (built once by TestMain) as a separate
// process over a fresh SOURCE and MOUNTPOINT, and drives the mount with real
// programs (flock(1), python3, sh, sqlite3, stress-ng), because flock and
// POSIX locks belong to processes and open file descriptions.
//
// The tests need /dev/fuse and fusermount3 (Debian: apt-get install -y
// fuse3) and the tools `make deps` installs. Without them a test is skipped,
// unless CI=true, where it fails: in CI the FUSE tests must run.
//
// Environment:
//
//	CI=true                   missing prerequisites fail instead of skipping
//	LOCKFS_STORM_TRIALS=N     kill-during-wait trials (default 300; make storm: 10000)
//	LOCKFS_DAEMON_RACE=0      build the daemon without the race detector
//	LOCKFS_TEST_LOG_LEVEL=L   the daemon's --log-level (default debug)
package integration
