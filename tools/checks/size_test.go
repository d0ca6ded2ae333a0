package checks

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Limits on one file and one function of non-generated, non-test code
// outside tools/bench: past them a file mixes concerns and a function
// does several things. sizeExceptions names each function allowed past
// the limit, and why.
const (
	maxFileLines = 600
	maxFuncLines = 80
)

var sizeExceptions = map[string]string{}

// TestFileAndFunctionSize enforces maxFileLines and maxFuncLines.
func TestFileAndFunctionSize(t *testing.T) {
	root := filepath.Join("..", "..")
	var checked int
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if (strings.HasPrefix(d.Name(), ".") && path != root) || d.Name() == "testdata" || rel == filepath.Join("tools", "bench") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(src), "\n// Code generated ") || strings.HasPrefix(string(src), "// Code generated ") {
			return nil
		}
		checked++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		if n := fset.Position(f.End()).Line; n > maxFileLines {
			t.Errorf("%s: %d lines (limit %d)", rel, n, maxFileLines)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			name := fn.Name.Name
			if fn.Recv != nil && len(fn.Recv.List) == 1 {
				typ := fn.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if ix, ok := typ.(*ast.IndexExpr); ok {
					typ = ix.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					name = id.Name + "." + name
				}
			}
			key := filepath.ToSlash(filepath.Dir(rel)) + "." + name
			n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if _, ok := sizeExceptions[key]; n > maxFuncLines && !ok {
				t.Errorf("%s: %s is %d lines (limit %d)", rel, key, n, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files; is the walk rooted right?", checked)
	}
}
