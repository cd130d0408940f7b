package lockmgr

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestMuNames checks the naming rule of doc.go's # Locking on the
// package's source: a …Locked helper never releases Engine.mu, neither
// itself nor through a …DropsMu or …UnlocksMu helper; a …DropsMu helper
// does one or the other. Function literals are left out: the ones in
// …Locked helpers run later, on goroutines that take mu themselves.
func TestMuNames(t *testing.T) {
	for _, bad := range muNameErrors(t, ".") {
		t.Error(bad)
	}
}

// TestMuNamesControl: the check fails on a …Locked helper that drops mu.
func TestMuNamesControl(t *testing.T) {
	dir := t.TempDir()
	src := `package lockmgr
func (e *Engine) settleLocked() { e.mu.Unlock(); e.mu.Lock() }
func (e *Engine) stepLocked() { e.waitDropsMu() }
func (e *Engine) waitDropsMu() { e.mu.Unlock(); e.mu.Lock() }
func (e *Engine) idleDropsMu() {}
`
	if err := os.WriteFile(dir+"/x.go", []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := muNameErrors(t, dir); len(got) != 3 {
		t.Errorf("found %d errors, want 3: %q", len(got), got)
	}
}

func muNameErrors(t *testing.T, dir string) []string {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				name := fd.Name.Name
				drops := dropsMu(fd.Body)
				switch {
				case strings.HasSuffix(name, "Locked") && drops != "":
					bad = append(bad, name+" releases mu ("+drops+"): name it …DropsMu")
				case strings.HasSuffix(name, "DropsMu") && drops == "":
					bad = append(bad, name+" never releases mu: name it …Locked")
				}
			}
		}
	}
	return bad
}

// dropsMu returns the first call in body, outside function literals, that
// releases Engine.mu: e.mu.Unlock() or a …DropsMu or …UnlocksMu helper;
// "" if none.
func dropsMu(body *ast.BlockStmt) string {
	found := ""
	ast.Inspect(body, func(n ast.Node) bool {
		if found != "" {
			return false
		}
		if _, ok := n.(*ast.FuncLit); ok {
			return false
		}
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		name := sel.Sel.Name
		if strings.HasSuffix(name, "DropsMu") || strings.HasSuffix(name, "UnlocksMu") {
			found = name
		}
		if x, ok := sel.X.(*ast.SelectorExpr); ok && x.Sel.Name == "mu" && name == "Unlock" {
			if id, ok := x.X.(*ast.Ident); ok && id.Name == "e" {
				found = "e.mu.Unlock"
			}
		}
		return true
	})
	return found
}
