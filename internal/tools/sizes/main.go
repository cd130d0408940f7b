// Command sizes lists the non-test Go files over 400 lines and the
// functions over 80 lines of a tree (third_party and .git left out), the
// limits of issue 30, and counts them:
//
//	go run ./internal/tools/sizes .
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Limits.
const (
	maxFileLines = 400
	maxFuncLines = 80
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	files, funcs := report(os.Stdout, root)
	fmt.Printf("files>%d: %d funcs>%d: %d\n", maxFileLines, files, maxFuncLines, funcs)
}

// report prints every file and function over its limit under root to w,
// and returns how many of each.
func report(w io.Writer, root string) (files, funcs int) {
	filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		if info.IsDir() && (info.Name() == "third_party" || info.Name() == ".git") {
			return filepath.SkipDir
		}
		if info.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		b, _ := os.ReadFile(p)
		n := strings.Count(string(b), "\n")
		if n > maxFileLines {
			fmt.Fprintf(w, "FILE %5d %s\n", n, rel)
			files++
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, b, 0)
		if err != nil {
			return nil
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			l := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if l > maxFuncLines {
				name := fd.Name.Name
				if fd.Recv != nil && len(fd.Recv.List) > 0 {
					t := fd.Recv.List[0].Type
					if s, ok := t.(*ast.StarExpr); ok {
						t = s.X
					}
					if id, ok := t.(*ast.Ident); ok {
						name = id.Name + "." + name
					}
				}
				fmt.Fprintf(w, "FUNC %5d %s %s\n", l, rel, name)
				funcs++
			}
		}
		return nil
	})
	return files, funcs
}
