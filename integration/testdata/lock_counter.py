"""A counter incremented under fcntl locks (integration/coherence_test.go).

usage: lock_counter.py FILE N

Opens FILE once, prints "ready", waits for a line on stdin (so that the
counters run at the same time), and N times: takes an exclusive lockf lock on the whole
file, reads the decimal number in it, writes the number plus one, unlocks.
Reading through the descriptor it keeps open is what a stale cache breaks.
"""
import fcntl
import os
import sys

path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDWR)
print("ready", flush=True)
sys.stdin.readline()
for _ in range(n):
    fcntl.lockf(fd, fcntl.LOCK_EX)
    text = os.pread(fd, 64, 0).decode().strip()
    value = int(text or "0") + 1
    data = b"%d\n" % value
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    fcntl.lockf(fd, fcntl.LOCK_UN)
print("done", flush=True)
