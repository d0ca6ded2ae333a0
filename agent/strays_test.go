package agent

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/procfs"
)

// TestDescendsFollowsParents: a worker under a worker_binary wrapper that
// forks (a shell running it without exec) descends from the wrapper's
// pid, the one the agent recorded and keeps; nothing descends from 0,
// and a parent does not descend from its child.
func TestDescendsFollowsParents(t *testing.T) {
	sh := exec.Command("sh", "-c", "sleep 30; true")
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sh.Process.Kill(); sh.Wait() }()
	child := 0
	for deadline := time.Now().Add(10 * time.Second); child == 0 && time.Now().Before(deadline); {
		for _, p := range procfs.Mentioning("sleep") {
			if parent, err := procfs.Parent(p.PID); err == nil && parent == sh.Process.Pid {
				child = p.PID
			}
		}
		time.Sleep(time.Millisecond)
	}
	if child == 0 {
		t.Fatal("the shell's child never showed")
	}
	defer func() { p, _ := os.FindProcess(child); p.Kill() }()
	for _, c := range []struct {
		pid, keep int
		want      bool
	}{{child, sh.Process.Pid, true}, {sh.Process.Pid, sh.Process.Pid, true}, {child, 0, false}, {sh.Process.Pid, child, false}, {os.Getpid(), sh.Process.Pid, false}} {
		if got := descends(c.pid, c.keep); got != c.want {
			t.Errorf("descends(%d, %d) = %v, want %v", c.pid, c.keep, got, c.want)
		}
	}
}
