// Package binaries builds the lifeline and nodectl executables of this
// module for benchmarks and process tests. It imports nothing of ours, so
// any package's tests can use it without an import cycle.
package binaries

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ModuleRoot is the directory of the module the current directory is in.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
		return "", fmt.Errorf("binaries: not inside the module (go env GOMOD: %q, %v)", out, err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// Build compiles cmd/lifeline and cmd/nodectl of the module the current
// directory is in into dir, with the build tags tags, for benchmarks and
// tests that run the real binaries; it returns the lifeline binary's path.
func Build(dir string, tags ...string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	for _, name := range []string{"lifeline", "nodectl"} {
		cmd := exec.Command("go", "build", "-tags", strings.Join(tags, ","), "-o", filepath.Join(dir, name), "./cmd/"+name)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("binaries: build %s: %v\n%s", name, err, out)
		}
	}
	return filepath.Join(dir, "lifeline"), nil
}
