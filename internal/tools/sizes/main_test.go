package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReport: a file of 401 lines and a function of 81 are reported; one
// line fewer each, a test file and third_party are not (the control).
func TestReport(t *testing.T) {
	root := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fn := func(name string, lines int) string { // a function spanning lines lines
		return "func " + name + "() {\n" + strings.Repeat("\t_ = 0\n", lines-2) + "}\n"
	}
	write("a/long.go", "package a\n"+fn("Long", 81)+strings.Repeat("\n", 401-82))
	write("a/short.go", "package a\n"+fn("Short", 80)+strings.Repeat("\n", 400-81))
	write("a/long_test.go", "package a\n"+fn("T", 200)+strings.Repeat("\n", 500))
	write("third_party/x/x.go", "package x\n"+fn("X", 200)+strings.Repeat("\n", 500))
	var out strings.Builder
	files, funcs := report(&out, root)
	if files != 1 || funcs != 1 {
		t.Fatalf("files %d, funcs %d, want 1 and 1:\n%s", files, funcs, out.String())
	}
	for _, want := range []string{"FILE   401 a/long.go", "FUNC    81 a/long.go Long"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
