// Package cgtest creates memory-limited cgroups for tests that need the
// kernel's OOM killer: cgroup v1 where the memory controller is mounted,
// cgroup v2 otherwise.
package cgtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Memory creates a cgroup limited to limit bytes (swap off) and returns its
// directory; writing a pid to dir/cgroup.procs moves that process in. The
// cgroup is removed when the test ends. It skips only when the kernel has
// no memory controller at all.
func Memory(t testing.TB, limit int64) string {
	t.Helper()
	name := fmt.Sprintf("lifeline-oomtest-%d-%s", os.Getpid(), strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	var dir string
	var limits [][2]string
	if st, err := os.Stat("/sys/fs/cgroup/memory"); err == nil && st.IsDir() {
		dir = filepath.Join("/sys/fs/cgroup/memory", name)
		limits = [][2]string{{"memory.limit_in_bytes", fmt.Sprint(limit)}, {"memory.memsw.limit_in_bytes", fmt.Sprint(limit)}}
	} else if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(string(b), "memory") {
		os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+memory"), 0)
		dir = filepath.Join("/sys/fs/cgroup", name)
		limits = [][2]string{{"memory.max", fmt.Sprint(limit)}, {"memory.swap.max", "0"}}
	} else {
		t.Skip("no memory cgroup controller (v1 or v2) on this machine")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	// The first limit is required; the swap limit exists only where swap
	// accounting is enabled.
	if err := os.WriteFile(filepath.Join(dir, limits[0][0]), []byte(limits[0][1]), 0); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, limits[1][0]), []byte(limits[1][1]), 0)
	return dir
}
