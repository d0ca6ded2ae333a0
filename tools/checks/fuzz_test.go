package checks

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestMakeFuzzRunsEveryTarget: every Fuzz function of the repository has
// its line in the Makefile's fuzz target (-fuzz '^Name$$' ./its/dir/),
// so that `make fuzz` runs them all; a target added without one fails
// here, naming the line to add.
func TestMakeFuzzRunsEveryTarget(t *testing.T) {
	root := filepath.Join("..", "..")
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	fuzzFunc := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)
	found := 0
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, m := range fuzzFunc.FindAllStringSubmatch(string(src), -1) {
			found++
			want := fmt.Sprintf("-fuzz '^%s$$' -fuzztime $(FUZZTIME) ./%s/", m[1], filepath.ToSlash(rel))
			if !strings.Contains(string(mk), want) {
				t.Errorf("%s: %s is not in make fuzz: add\n\t$(GO) test -run '^$$' %s", path, m[1], want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 10 {
		t.Fatalf("found only %d fuzz targets; is the walk rooted right?", found)
	}
}
