package localbackend

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

func TestTokensIncreaseAcrossRestarts(t *testing.T) {
	src := newSource(t)
	ctx := context.Background()
	var last uint64
	for restart := range 3 {
		b, err := New(Config{Source: src, SyncTokens: restart == 1})
		if err != nil {
			t.Fatal(err)
		}
		l := mustClaim(t, b, dirID("."), lockmgr.Exclusive)
		for range 3 {
			tok, err := l.NextToken(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tok != last+1 {
				t.Fatalf("token %d after %d", tok, last)
			}
			last = tok
		}
		b.Close()
	}
	got, err := os.ReadFile(filepath.Join(src, "..LOCK"))
	if err != nil || string(got) != "9\n" {
		t.Fatalf("backing file: %q, %v", got, err)
	}
}

// Tokens are per lock: each backing file has its own counter.
func TestTokensPerLock(t *testing.T) {
	src := newSource(t, "d")
	b := newBackend(t, src)
	ctx := context.Background()
	a := mustClaim(t, b, dirID("d"), lockmgr.Shared)
	n := mustClaim(t, b, lockmgr.LockID{Path: "d", Kind: lockmgr.KindNewDir}, lockmgr.Shared)
	for _, l := range []lockmgr.Lease{a, a, n} {
		if _, err := l.NextToken(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if tok, _ := n.NextToken(ctx); tok != 2 {
		t.Fatalf("newdir token %d, want 2", tok)
	}
	if tok, _ := a.NextToken(ctx); tok != 3 {
		t.Fatalf("dir token %d, want 3", tok)
	}
}

// Many holders of one shared claim, in two backends of this process and in
// two other processes, draw tokens at once: every token is handed out once,
// and together they are exactly 1..N.
func TestTokensUniqueUnderConcurrency(t *testing.T) {
	testutil.CheckGoroutines(t)
	src := newSource(t)
	const perCaller = 300
	b1, b2 := newBackend(t, src), newBackend(t, src)

	var (
		mu   sync.Mutex
		seen = map[uint64]int{}
	)
	record := func(who int, tok uint64) {
		mu.Lock()
		defer mu.Unlock()
		if prev, dup := seen[tok]; dup {
			t.Errorf("token %d handed out twice (callers %d and %d)", tok, prev, who)
		}
		seen[tok] = who
	}

	// Two other processes.
	type proc struct {
		done chan error
	}
	var procs []proc
	for i := range 2 {
		cmd, out := startHelper(t, "tokens", src, strconv.Itoa(perCaller))
		p := proc{make(chan error, 1)}
		procs = append(procs, p)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				tok, err := strconv.ParseUint(sc.Text(), 10, 64)
				if err != nil {
					p.done <- err
					return
				}
				record(100+i, tok)
			}
			p.done <- cmd.Wait()
		}()
	}

	// Two backends here, two leases (two open file descriptions) each, and
	// two goroutines on one of the leases.
	var wg sync.WaitGroup
	callers := 0
	for _, b := range []*Backend{b1, b2} {
		for range 2 {
			l := mustClaim(t, b, dirID("."), lockmgr.Shared)
			goroutines := 1
			if callers == 0 {
				goroutines = 2
			}
			for range goroutines {
				callers++
				who := callers
				wg.Go(func() {
					for range perCaller {
						tok, err := l.NextToken(context.Background())
						if err != nil {
							t.Error(err)
							return
						}
						record(who, tok)
					}
				})
			}
		}
	}
	wg.Wait()
	for _, p := range procs {
		if err := <-p.done; err != nil {
			t.Fatalf("helper: %v", err)
		}
	}
	want := (callers + len(procs)) * perCaller
	if len(seen) != want {
		t.Fatalf("%d distinct tokens, want %d", len(seen), want)
	}
	for tok := uint64(1); tok <= uint64(want); tok++ {
		if _, ok := seen[tok]; !ok {
			t.Fatalf("token %d missing: tokens are not 1..%d", tok, want)
		}
	}
}

// The control for the test above: NextToken really takes the OFD lock. While
// another open file description holds it, NextToken waits (here until its
// deadline), and proceeds once it is released. The claim's flock does not
// interfere: this description holds no flock at all, and the lease's flock
// does not stop the test from taking the OFD lock.
// A shared claim's holders may bump the counter together, from several
// daemons: the OFD lock orders them. (An exclusive claim takes it too:
// TestTokenOfDowngradedClaim.)
func TestTokenWaitsForOFDLock(t *testing.T) {
	src := newSource(t)
	b := newBackend(t, src)
	l := mustClaim(t, b, dirID("."), lockmgr.Shared)

	f, err := os.OpenFile(filepath.Join(src, "..LOCK"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := ofdLock(int(f.Fd()), unix.F_WRLCK); err != nil {
		t.Fatalf("OFD lock beside the claim's flock: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if tok, err := l.NextToken(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("NextToken while the OFD lock is held elsewhere: got %d, %v; want DeadlineExceeded", tok, err)
	}
	if err := ofdLock(int(f.Fd()), unix.F_UNLCK); err != nil {
		t.Fatal(err)
	}
	if tok, err := l.NextToken(context.Background()); err != nil || tok != 1 {
		t.Fatalf("NextToken after unlock: %d, %v", tok, err)
	}
}

func TestTokenCorruptFile(t *testing.T) {
	src := newSource(t)
	file := filepath.Join(src, "..LOCK")
	if err := os.WriteFile(file, []byte("deploying v1.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, src)
	l := mustClaim(t, b, dirID("."), lockmgr.Exclusive)
	if _, err := l.NextToken(context.Background()); err == nil {
		t.Fatal("NextToken accepted a file whose first line is not a number")
	}
	if got, _ := os.ReadFile(file); string(got) != "deploying v1.2\n" {
		t.Fatalf("a failed NextToken changed the file: %q", got)
	}
	// A number followed by more lines is kept and the rest dropped.
	os.WriteFile(file, []byte(" 41 \r\nnote\nmore\n"), 0o644)
	if tok, err := l.NextToken(context.Background()); err != nil || tok != 42 {
		t.Fatalf("got %d, %v; want 42", tok, err)
	}
	if got, _ := os.ReadFile(file); string(got) != "42\n" {
		t.Fatalf("backing file %q", got)
	}
}

func TestParseToken(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"", 0, true},
		{"\n", 0, true},
		{"7", 7, true},
		{"7\n", 7, true},
		{"18446744073709551615\n", 1<<64 - 1, true},
		{"18446744073709551616\n", 0, false},
		{"-1\n", 0, false},
		{"0x10\n", 0, false},
		{"12 34\n", 0, false},
		{"1234567890123456789012", 0, false}, // no newline within the read
	} {
		got, err := parseToken([]byte(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseToken(%q) = %d, %v", tc.in, got, err)
		}
	}
}

func TestTokenExhausted(t *testing.T) {
	src := newSource(t)
	os.WriteFile(filepath.Join(src, "..LOCK"), []byte("18446744073709551615\n"), 0o644)
	b := newBackend(t, src)
	l := mustClaim(t, b, dirID("."), lockmgr.Exclusive)
	if tok, err := l.NextToken(context.Background()); err == nil {
		t.Fatalf("got token %d past the maximum", tok)
	}
}

// Calls on one lease share one open file description, which the OFD lock
// does not exclude from itself; they must still never share a token.
func TestTokensOneLeaseConcurrentCalls(t *testing.T) {
	src := newSource(t)
	b := newBackend(t, src)
	l := mustClaim(t, b, dirID("."), lockmgr.Shared)
	const goroutines, perCaller = 4, 500
	var (
		mu   sync.Mutex
		seen = map[uint64]bool{}
		wg   sync.WaitGroup
	)
	for range goroutines {
		wg.Go(func() {
			for range perCaller {
				tok, err := l.NextToken(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[tok] {
					t.Errorf("token %d handed out twice", tok)
				}
				seen[tok] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != goroutines*perCaller {
		t.Fatalf("%d distinct tokens, want %d", len(seen), goroutines*perCaller)
	}
}

// A token asked for on an exclusive claim that is downgraded meanwhile
// (lockmgr issues a token when it is first read, which may be while its
// holder converts): another daemon's shared claim may then bump the
// counter too, and the two bumps must not interleave. Here the downgrade
// and the other daemon's claim and NextToken come between this call's read
// of the counter and its write. Control: with the exclusive claim's bump
// made without the OFD lock, as it once was, both calls got token 1.
func TestTokenOfDowngradedClaim(t *testing.T) {
	src := newSource(t)
	b1, b2 := newBackend(t, src), newBackend(t, src)
	l1 := mustClaim(t, b1, dirID("."), lockmgr.Exclusive)
	ctx := context.Background()

	var (
		l2   lockmgr.Lease
		tok2 uint64
		err2 error
	)
	done := make(chan struct{})
	testHookTokenRead = func() {
		testHookTokenRead = nil
		if err := l1.Convert(ctx, lockmgr.Shared, false); err != nil {
			t.Errorf("downgrade: %v", err)
			close(done)
			return
		}
		l2 = mustClaim(t, b2, dirID("."), lockmgr.Shared)
		go func() {
			defer close(done)
			tok2, err2 = l2.NextToken(ctx)
		}()
		select {
		case <-done: // finished inside the other call's read and write
		case <-time.After(300 * time.Millisecond):
		}
	}
	t.Cleanup(func() { testHookTokenRead = nil })

	tok1, err := l1.NextToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the other daemon's NextToken did not return")
	}
	if err2 != nil {
		t.Fatal(err2)
	}
	if tok1 == tok2 {
		t.Fatalf("both calls got token %d", tok1)
	}
	if tok1 != 1 || tok2 != 2 {
		t.Fatalf("tokens %d (downgraded claim) and %d (the other daemon's), want 1 then 2", tok1, tok2)
	}
}
