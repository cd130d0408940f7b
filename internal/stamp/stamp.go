// Package stamp is the one clock that processes taking turns in a lock
// write their time in it with, so that the intervals of holders on
// different hosts (daemons) can be compared: the bench's paused-host
// overlap and the integration tests of fair turns between hosts.
package stamp

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Program is a python3 program (run it with `python3 -c`) that appends
// "TAG <CLOCK_MONOTONIC seconds>" to FILE every 10 ms for SECONDS (argv:
// TAG FILE SECONDS), after printing "held" once its first stamp is
// written. Holders of different hosts run it under flock, so that their
// intervals in the lock are written from one clock.
const Program = `
import os, sys, time
tag, out, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
def stamp():
    os.write(fd, ("%s %.6f\n" % (tag, time.monotonic())).encode())
stamp()
print("held", flush=True)
end = time.monotonic() + secs
while time.monotonic() < end:
    time.sleep(0.01)
    stamp()
stamp()
`

// Spans reads a file that Program wrote: each tag's first and last stamp,
// in seconds of CLOCK_MONOTONIC.
func Spans(file string) (map[string][2]float64, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][2]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		tag, v, ok := strings.Cut(sc.Text(), " ")
		x, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("stamp line %q", sc.Text())
		}
		span, seen := out[tag]
		if !seen {
			span[0] = x
		}
		span[1] = x
		out[tag] = span
	}
	return out, sc.Err()
}
