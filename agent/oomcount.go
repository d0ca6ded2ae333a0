package agent

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// oomCounter reads the worker cgroup's count of OOM kills (cgroup v2
// memory.events "oom_kill", v1 memory.oom_control "oom_kill"): a second
// witness for a SIGKILL exit whose OOM mark the probes missed (the mark's
// thread gone before it was resolved to its process).
type oomCounter struct {
	dir  string
	mu   sync.Mutex
	seen uint64
}

func newOOMCounter(dir string) *oomCounter {
	c := &oomCounter{dir: dir}
	c.seen, _ = c.read()
	return c
}

// killedSince reports whether the cgroup counted an OOM kill since the
// last call (or since it was made).
func (c *oomCounter) killedSince() bool {
	if c == nil {
		return false
	}
	n, ok := c.read()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok || n <= c.seen {
		return false
	}
	c.seen = n
	return true
}

func (c *oomCounter) read() (uint64, bool) {
	for _, name := range []string{"memory.events", "memory.oom_control"} {
		f, err := os.Open(filepath.Join(c.dir, name))
		if err != nil {
			continue
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}
