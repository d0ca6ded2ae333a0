package checks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProcessTestsLiveInE2E: a test file named *_process_test.go starts
// the real binaries; it lives with the other end-to-end tests under
// tests/e2e, not inside a library package, so that the tiers show in the
// tree and the end-to-end packages run beside each other.
func TestProcessTestsLiveInE2E(t *testing.T) {
	root := filepath.Join("..", "..")
	found := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), "_process_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if strings.HasPrefix(rel, "tests/e2e/") {
			found++
			return nil
		}
		t.Errorf("%s: a process test inside a library package; move it to tests/e2e/", rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 20 {
		t.Fatalf("found %d process tests under tests/e2e; is the walk rooted right?", found)
	}
}
