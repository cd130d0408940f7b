package lockmgr

import (
	"testing"
	"time"
)

// TestClaimRecordLine: a claim record read back from its line is the same
// record (the status file's claim lines are read by lockfs lock -v), and a
// line with an unknown mode or field reads as far as it can. Control: a
// record that differs in any field renders another line.
func TestClaimRecordLine(t *testing.T) {
	c := ClaimRecord{Host: "build-7.a1", Mode: Exclusive, Since: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
		Session: "s1.abc", State: "stale", Use: "claimed"}
	line := c.String()
	if want := "host=build-7.a1 mode=exclusive since=2026-12-01T10:00:00Z session=s1.abc state=stale use=claimed"; line != want {
		t.Fatalf("String: %q, want %q", line, want)
	}
	if got := ParseClaimRecord(line); got != c {
		t.Fatalf("ParseClaimRecord(%q) = %+v, want %+v", line, got, c)
	}
	other := c
	other.Use = "warm"
	if other.String() == line {
		t.Fatalf("records that differ render the same line %q", line)
	}
	got := ParseClaimRecord("host=h mode=upgrading colour=blue since=yesterday use=held")
	if want := (ClaimRecord{Host: "h", Use: "held"}); got != want {
		t.Fatalf("a line with unknown values: %+v, want %+v", got, want)
	}
}
