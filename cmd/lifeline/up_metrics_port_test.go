package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestUpMovesATakenMetricsPort: `lifeline up` picks each agent's metrics
// port free, without holding it. The agent is SIGKILLed and the test
// binds its port before up restarts it: the agent must come back on
// another port that up names (it used to exit at every restart,
// "address already in use", for as long as the port stayed taken).
func TestUpMovesATakenMetricsPort(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	up := startUp(t, dir, "--nodes", "1")
	m := regexp.MustCompile(`agent metrics http://([0-9.:]+)/metrics`).FindStringSubmatch(up.out.String())
	if m == nil {
		t.Fatalf("up printed no agent metrics address:\n%s", up.out.String())
	}
	old := m[1]
	sock := filepath.Join(dir, "node-0", "agent.sock")
	ws, err := nodectl.Workers(context.Background(), sock)
	if err != nil || len(ws) != 1 {
		t.Fatalf("workers of node-0: %v %v", ws, err)
	}
	syscall.Kill(agentOf(t, ws[0].PID), syscall.SIGKILL)
	// Up waits 100 ms before its first restart: take the port as soon as
	// the killed agent let it go.
	var taken net.Listener
	proctest.WaitFor(t, 10*time.Second, "the killed agent's metrics port to be free", func() (bool, string) {
		taken, err = net.Listen("tcp", old)
		return err == nil, fmt.Sprint(err)
	})
	defer taken.Close()
	var moved string
	proctest.WaitFor(t, time.Minute, "up to restart the agent on another metrics port", func() (bool, string) {
		m := regexp.MustCompile(`up: agent 0: its metrics address ` + regexp.QuoteMeta(old) + ` is taken \(.*\); it serves them on ([0-9.:]+) now`).FindStringSubmatch(up.out.String())
		if m != nil {
			moved = m[1]
		}
		return moved != "", up.out.String()
	})
	proctest.WaitFor(t, time.Minute, "the restarted agent to serve its metrics on "+moved, func() (bool, string) {
		resp, err := http.Get("http://" + moved + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	if n := strings.Count(up.out.String(), "up: agent 0 exited"); n != 1 {
		t.Fatalf("up restarted agent 0 %d times, want once:\n%s", n, up.out.String())
	}
}
