package buildflags

import (
	"os"
	"regexp"
	"testing"
)

// The Makefile builds, vets and tests with the same tags as the Go code
// that builds lockfs (bench, integration).
func TestMakefileBuildsWithTags(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^TAGS\s*:=\s*(\S+)\s*$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no TAGS := line")
	}
	if got := string(m[1]); got != Tags {
		t.Fatalf("Makefile's TAGS is %q, buildflags.Tags %q", got, Tags)
	}
}
