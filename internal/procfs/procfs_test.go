package procfs

import (
	"os"
	"slices"
	"testing"
)

// TestTaskStateOfThisProcess: this process's main thread is listed and
// running or sleeping; a task that does not exist is an error.
func TestTaskStateOfThisProcess(t *testing.T) {
	pid := os.Getpid()
	tids, err := Tasks(pid)
	if err != nil || !slices.Contains(tids, pid) {
		t.Fatalf("tasks %v, %v: want the main thread %d", tids, err, pid)
	}
	if s, err := TaskState(pid, pid); err != nil || (s != 'R' && s != 'S') {
		t.Fatalf("state %q, %v", s, err)
	}
	if _, err := TaskState(pid, 1<<30); err == nil {
		t.Fatal("a task that does not exist has a state")
	}
}
