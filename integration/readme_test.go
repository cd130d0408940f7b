package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// readmeBlock is one fenced code block of README.md.
type readmeBlock struct {
	line int    // of the opening fence
	lang string // sh, python, go...
	text string
	skip string // the reason given by a <!-- readme-test: skip: ... --> marker
}

// readmeBlocks returns README.md's fenced code blocks.
func readmeBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	var out []readmeBlock
	for i := 0; i < len(lines); i++ {
		lang, ok := strings.CutPrefix(lines[i], "```")
		if !ok || lang == "" {
			continue
		}
		blk := readmeBlock{line: i + 1, lang: lang}
		if i > 0 {
			if reason, ok := strings.CutPrefix(strings.TrimSpace(lines[i-1]), "<!-- readme-test: skip:"); ok {
				blk.skip = strings.TrimSpace(strings.TrimSuffix(reason, "-->"))
			}
		}
		var body []string
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			body = append(body, lines[i])
		}
		blk.text = strings.Join(body, "\n") + "\n"
		out = append(out, blk)
	}
	return out
}

// TestReadmeExamples runs the README's examples, in the order written,
// against a real mount of the demo tree (scripts/demo-tree.sh) at demo/mnt,
// from a directory that also has bin/lockfs: each ```sh block with bash
// -e, the Python block with python3, the Go block with go run. A block
// marked <!-- readme-test: skip: REASON --> is skipped and logged with its
// reason; any other block must succeed, and the output promised in its
// comments ("prints busy") must appear. An unknown language fails, so that
// a new kind of example cannot be left out silently.
func TestReadmeExamples(t *testing.T) {
	require(t, "python3", "bash")
	base := t.TempDir()
	demo := filepath.Join(base, "demo")
	if r := run(t, 30*time.Second, "bash", "../scripts/demo-tree.sh", filepath.Join(demo, "source")); r.code != 0 {
		t.Fatalf("demo-tree.sh: %v", r)
	}
	// The README's paths are relative: demo/mnt and bin/lockfs under base.
	if err := os.Mkdir(filepath.Join(demo, "mnt"), 0o755); err != nil {
		t.Fatal(err)
	}
	requireFUSE(t)
	startMount(t, filepath.Join(demo, "source"), filepath.Join(demo, "mnt")).waitReady()
	if err := os.MkdirAll(filepath.Join(base, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(lockfsBin, filepath.Join(base, "bin", "lockfs")); err != nil {
		t.Fatal(err)
	}

	ran := 0
	for _, blk := range readmeBlocks(t) {
		if blk.skip != "" {
			t.Logf("README.md:%d (%s): skipped: %s", blk.line, blk.lang, blk.skip)
			continue
		}
		var cmd *exec.Cmd
		ctx := t.Context()
		switch blk.lang {
		case "sh":
			cmd = command(ctx, "bash", "-e", "-o", "pipefail", "-c", blk.text)
		case "python":
			cmd = command(ctx, "python3", "-c", blk.text)
		case "go":
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(blk.text), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd = command(ctx, goTool(), "run", filepath.Join(dir, "main.go"))
			cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GO111MODULE=on")
		case "yaml", "text", "":
			continue // configuration shown, not run
		default:
			t.Errorf("README.md:%d: a ```%s block, which this test cannot run: mark it <!-- readme-test: skip: REASON -->", blk.line, blk.lang)
			continue
		}
		cmd.Dir = base
		r := runCmd(t, ctx, cmd)
		if r.code != 0 {
			t.Errorf("README.md:%d (%s) failed: %v\n%s", blk.line, blk.lang, r, blk.text)
			continue
		}
		for _, want := range promised(blk.text) {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("README.md:%d (%s): promises %q, printed %q", blk.line, blk.lang, want, r.stdout)
			}
		}
		ran++
		t.Logf("README.md:%d (%s): ok, printed %q", blk.line, blk.lang, r.stdout)
	}
	if ran < 4 {
		t.Errorf("only %d README examples ran: the shell, Python, Go and lockfs lock examples at least must", ran)
	}
}

// promised returns what a block's comments say it prints ("prints busy").
func promised(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		_, after, ok := strings.Cut(line, "prints ")
		if !ok || !strings.Contains(line, "#") {
			continue
		}
		word := strings.Fields(after)
		if len(word) > 0 {
			out = append(out, strings.Trim(word[0], ".,;:"))
		}
	}
	return out
}
