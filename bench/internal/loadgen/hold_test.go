package main

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// scripted returns a lock function that fails with errs in turn, then
// succeeds, and counts its calls.
func scripted(calls *int, errs ...error) func() error {
	return func() error {
		*calls++
		if *calls <= len(errs) {
			return errs[*calls-1]
		}
		return nil
	}
}

func TestLockRetrying(t *testing.T) {
	var slept []time.Duration
	sleep := func(d time.Duration) { slept = append(slept, d) }

	// A slow moment: two ENOLCK, then the lock. Held, two retries, a
	// doubling backoff.
	calls := 0
	r, err := lockRetrying(scripted(&calls, unix.ENOLCK, unix.ENOLCK), 8, sleep)
	if err != nil || r != 2 || calls != 3 {
		t.Fatalf("ENOLCK twice: retries %d calls %d err %v, want 2, 3, nil", r, calls, err)
	}
	if len(slept) != 2 || slept[0] != retryFirst || slept[1] != 2*retryFirst {
		t.Fatalf("backoff %v, want [%v %v]", slept, retryFirst, 2*retryFirst)
	}

	// Control: a conflict (someone else holds the lock) and a lost lease
	// fail at once, never asked again.
	for _, e := range []error{unix.EWOULDBLOCK, unix.EIO} {
		calls, slept = 0, nil
		r, err = lockRetrying(scripted(&calls, e), 8, sleep)
		if !errors.Is(err, e) || r != 0 || calls != 1 || len(slept) != 0 {
			t.Fatalf("%v: retries %d calls %d err %v slept %v, want it at once", e, r, calls, err, slept)
		}
	}

	// ENOLCK past the bound fails the hold; the backoff stops growing at
	// retryMost.
	calls, slept = 0, nil
	forever := make([]error, 100)
	for i := range forever {
		forever[i] = unix.ENOLCK
	}
	r, err = lockRetrying(scripted(&calls, forever...), 8, sleep)
	if !errors.Is(err, unix.ENOLCK) || r != 8 || calls != 9 {
		t.Fatalf("ENOLCK always: retries %d calls %d err %v, want 8, 9, ENOLCK", r, calls, err)
	}
	if last := slept[len(slept)-1]; last != retryMost {
		t.Fatalf("last backoff %v, want %v", last, retryMost)
	}
}
