package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestOOMCounter: a rise of the cgroup's oom_kill count is reported once;
// no file, or no rise, is not an OOM kill.
func TestOOMCounter(t *testing.T) {
	dir := t.TempDir()
	write := func(n string) {
		if err := os.WriteFile(filepath.Join(dir, "memory.events"), []byte("low 0\nhigh 0\nmax 3\noom 2\noom_kill "+n+"\noom_group_kill 0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var none *oomCounter
	if none.killedSince() {
		t.Fatal("no cgroup: an OOM kill")
	}
	c := newOOMCounter(t.TempDir())
	if c.killedSince() {
		t.Fatal("no memory.events: an OOM kill")
	}
	write("2")
	c = newOOMCounter(dir)
	if c.killedSince() {
		t.Fatal("kills before the counter started were reported")
	}
	write("3")
	if !c.killedSince() || c.killedSince() {
		t.Fatal("one new kill: want true once")
	}
}
