package checks

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// goroutineOwners lists, per package whose Run waits for every goroutine
// it started, the only functions that may hold a go statement: the owner
// that starts them for everyone else and its bounded wait.
var goroutineOwners = map[string][]string{
	"agent":    {"(*Agent).track", "(*Agent).awaitGoroutines"},
	"frontend": {"(*owned).Go", "(*owned).wait"},
}

// funcName is a declaration's name as goroutineOwners spells it.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	recv := fn.Recv.List[0].Type
	star := ""
	if s, ok := recv.(*ast.StarExpr); ok {
		recv, star = s.X, "*"
	}
	if id, ok := recv.(*ast.Ident); ok {
		return "(" + star + id.Name + ")." + fn.Name.Name
	}
	return fn.Name.Name
}

// bareGoStatements lists the go statements of src outside the functions
// owners names.
func bareGoStatements(t *testing.T, name string, src any, owners []string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || slices.Contains(owners, funcName(fn)) {
			continue
		}
		ast.Inspect(fn, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok {
				out = append(out, fset.Position(g.Pos()).String()+" in "+funcName(fn))
			}
			return true
		})
	}
	return out
}

// TestEveryGoroutineOwned: in the packages whose Run waits for what it
// started, no goroutine starts but through the owner (the agent's track,
// the frontend's goes.Go): a bare go statement is one Run would not wait
// for.
func TestEveryGoroutineOwned(t *testing.T) {
	root := filepath.Join("..", "..")
	for pkg, owners := range goroutineOwners {
		files, err := filepath.Glob(filepath.Join(root, pkg, "*.go"))
		if err != nil || len(files) < 10 {
			t.Fatalf("%s: %d files (%v); is the walk rooted right?", pkg, len(files), err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range bareGoStatements(t, path, src, owners) {
				t.Errorf("%s: a bare go statement; start it through the package's owner (%s) so that Run waits for it", g, owners[0])
			}
		}
	}
}

// TestGoroutineCheckCatchesPlantedGo: a go statement is found in a plain
// function, a method and a closure, and not in the owner.
func TestGoroutineCheckCatchesPlantedGo(t *testing.T) {
	src := `package x
type o struct{}
func (*o) Go(f func()) { go f() }
func (o) m() { go println() }
func f() { func() { go println() }(); go func() {}() }`
	got := bareGoStatements(t, "x.go", src, []string{"(*o).Go"})
	if len(got) != 3 {
		t.Fatalf("found %d go statements, want 3: %v", len(got), got)
	}
}
