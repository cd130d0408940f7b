package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// recorderPkg is the package the instrumented copy's functions call; it
// exists only in that copy.
const recorderPkg = "internal/calltrace"

// recorder is its source: Enter writes "GOROUTINE E FILE FUNC" to the file
// that $LOCKFS_CALLTRACE names and returns the function, deferred by the
// instrumented one, that writes the matching X line.
const recorder = `// Package calltrace records function entries and exits, for
// internal/tools/requestpath. It exists only in an instrumented copy.
package calltrace

import (
	"fmt"
	"os"
	"runtime"
	"sync"
)

var (
	mu  sync.Mutex
	out *os.File
)

func init() {
	if p := os.Getenv("LOCKFS_CALLTRACE"); p != "" {
		out, _ = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	}
}

func goid() int {
	var b [64]byte
	var id int
	fmt.Sscanf(string(b[:runtime.Stack(b[:], false)]), "goroutine %d", &id)
	return id
}

// Enter records a call of fn, defined in file.
func Enter(file, fn string) func() {
	if out == nil {
		return func() {}
	}
	g := goid()
	mu.Lock()
	fmt.Fprintf(out, "%d E %s %s\n", g, file, fn)
	mu.Unlock()
	return func() {
		mu.Lock()
		fmt.Fprintf(out, "%d X %s %s\n", g, file, fn)
		mu.Unlock()
	}
}
`

// skipDirs are not instrumented: code outside the product (tests, the
// benchmark harness, tools) and the recorder itself.
var skipDirs = []string{"third_party", "bench", "integration", "internal/tools", "internal/testutil", recorderPkg, "demo", "dist", "bin"}

// instrumentTree writes the recorder into the copy at root and makes every
// function and function literal of its non-test Go files (outside
// skipDirs) record its calls.
func instrumentTree(root, module string) error {
	if err := os.MkdirAll(filepath.Join(root, recorderPkg), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, recorderPkg, "calltrace.go"), []byte(recorder), 0o644); err != nil {
		return err
	}
	return filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel != "." && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			for _, s := range skipDirs {
				if rel == s {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		return instrumentFile(p, rel, module+"/"+recorderPkg)
	})
}

type insertion struct {
	off  int
	text string
}

// instrumentFile inserts `defer calltrace_.Enter(FILE, FUNC)()` at the top
// of every function body of the file at path (rel from the module root).
func instrumentFile(path, rel, importPath string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		return err
	}
	var ins []insertion
	add := func(body *ast.BlockStmt, name string) {
		if body != nil {
			ins = append(ins, insertion{fset.Position(body.Lbrace).Offset + 1, fmt.Sprintf("defer calltrace_.Enter(%q, %q)();", rel, name)})
		}
	}
	for _, d := range f.Decls {
		name := "var"
		if fd, ok := d.(*ast.FuncDecl); ok {
			name = funcName(fd)
			add(fd.Body, name)
		}
		n := 0
		ast.Inspect(d, func(x ast.Node) bool {
			if fl, ok := x.(*ast.FuncLit); ok {
				n++
				add(fl.Body, fmt.Sprintf("%s.func%d", name, n))
			}
			return true
		})
	}
	if len(ins) == 0 {
		return nil
	}
	ins = append(ins, insertion{fset.Position(f.Name.End()).Offset, fmt.Sprintf("\nimport calltrace_ %q\n", importPath)})
	sort.Slice(ins, func(i, j int) bool { return ins[i].off > ins[j].off })
	out := src
	for _, in := range ins {
		out = append(out[:in.off:in.off], append([]byte(in.text), out[in.off:]...)...)
	}
	return os.WriteFile(path, out, 0o644)
}

// funcName is fd's name, with its receiver's type for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
