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

// TestParentOfThisProcess: this process's parent is the one the kernel
// names; a process that does not exist is an error.
func TestParentOfThisProcess(t *testing.T) {
	if got, err := Parent(os.Getpid()); err != nil || got != os.Getppid() {
		t.Fatalf("Parent = %d, %v; want %d", got, err, os.Getppid())
	}
	if _, err := Parent(1 << 30); err == nil {
		t.Fatal("a process that does not exist has a parent")
	}
}
