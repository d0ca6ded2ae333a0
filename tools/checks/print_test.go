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

// mayPrint are the library packages that print by design: a failpoint's
// hit is the line the tests that armed it read from the process's
// stderr.
var mayPrint = []string{"internal/failpoint"}

// prints lists the calls in src that write to the process's standard
// output or error, or log through the standard logger: fmt.Print*,
// fmt.Fprint* to os.Stdout or os.Stderr, log.Print*/Fatal*/Panic*,
// print and println.
func prints(t *testing.T, name string, src any) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		bad := ""
		switch fn := call.Fun.(type) {
		case *ast.Ident:
			if fn.Name == "print" || fn.Name == "println" {
				bad = fn.Name
			}
		case *ast.SelectorExpr:
			pkg, _ := fn.X.(*ast.Ident)
			switch {
			case pkg == nil:
			case pkg.Name == "fmt" && strings.HasPrefix(fn.Sel.Name, "Print"):
				bad = "fmt." + fn.Sel.Name
			case pkg.Name == "fmt" && strings.HasPrefix(fn.Sel.Name, "Fprint") && len(call.Args) > 0:
				if w, ok := call.Args[0].(*ast.SelectorExpr); ok {
					if x, ok := w.X.(*ast.Ident); ok && x.Name == "os" && (w.Sel.Name == "Stdout" || w.Sel.Name == "Stderr") {
						bad = "fmt." + fn.Sel.Name + "(os." + w.Sel.Name + ")"
					}
				}
			case pkg.Name == "log" && (strings.HasPrefix(fn.Sel.Name, "Print") || strings.HasPrefix(fn.Sel.Name, "Fatal") || strings.HasPrefix(fn.Sel.Name, "Panic")):
				bad = "log." + fn.Sel.Name
			}
		}
		if bad != "" {
			out = append(out, fset.Position(call.Pos()).String()+": "+bad)
		}
		return true
	})
	return out
}

// TestLibrariesNeverPrint: outside mains (cmd/, tools/, package main) no
// package writes to stdout or stderr or logs through the standard
// logger; it returns errors or takes a *slog.Logger from its caller.
func TestLibrariesNeverPrint(t *testing.T) {
	root := filepath.Join("..", "..")
	files := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || rel == "cmd" || rel == "tools") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		for _, p := range mayPrint {
			if filepath.ToSlash(filepath.Dir(rel)) == p {
				return nil
			}
		}
		head, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly)
		if err != nil || head.Name.Name == "main" {
			return err
		}
		files++
		for _, p := range prints(t, path, nil) {
			t.Errorf("%s: a library prints; return an error or log to the *slog.Logger its caller gives", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read only %d library files; is the walk rooted right?", files)
	}
}

// TestPrintCheckCatchesPlantedPrints: each kind of print is found.
func TestPrintCheckCatchesPlantedPrints(t *testing.T) {
	src := `package x
import ("fmt"; "log"; "os")
func f(w *os.File) {
	fmt.Println("a"); fmt.Fprintf(os.Stderr, "b"); log.Printf("c"); println("d")
	fmt.Fprintf(w, "fine"); _ = fmt.Sprintf("fine")
}`
	if got := prints(t, "x.go", src); len(got) != 4 {
		t.Fatalf("found %d prints, want 4: %v", len(got), got)
	}
}
