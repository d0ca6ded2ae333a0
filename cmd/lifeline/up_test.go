package main

import (
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/localcluster/clustertest"
	"github.com/lifeline-llm/lifeline/internal/proctest"
)

// TestUpServesAndStopsCleanly: `lifeline up` from nothing in a temporary
// directory serves a streaming request through its frontend and, on
// Ctrl-C, stops without leaving a process behind.
func TestUpServesAndStopsCleanly(t *testing.T) {
	dir := t.TempDir()
	up := exec.Command(proctest.Lifeline(t), "up", "--data-dir", dir, "--nodes", "2", "--preset", "tiny", "--listen", proctest.FreeTCPAddr(t))
	out, _ := up.StdoutPipe()
	up.Stderr = os.Stderr
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { up.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			up.Process.Kill()
			<-exited
		}
	})
	url := strings.TrimPrefix(proctest.WaitLine(t, out, "URL http://"), "URL ")
	// Both nodes' workers come up; the frontend routes to a ready one.
	var toks []clustertest.Token
	proctest.WaitFor(t, time.Minute, "lifeline up to serve", func() (bool, string) {
		b := `{"model":"tiny","prompt":"hello there","max_tokens":12,"seed":3,"stream":true,"ignore_eos":true}`
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(b))
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return false, resp.Status
		}
		toks = clustertest.ReadSSE(t, resp.Body, nil)
		return true, ""
	})
	if len(toks) != 12 {
		t.Fatalf("%d tokens through lifeline up", len(toks))
	}
	up.Process.Signal(syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatal("lifeline up did not stop within 60s of Ctrl-C")
	}
	if left := proctest.ProcessesMentioning(dir); len(left) > 0 {
		t.Fatalf("processes left behind: %v", left)
	}
}

// TestDemoFailover runs `lifeline demo failover` as a user would.
func TestDemoFailover(t *testing.T) {
	out, errOut, err := proctest.Run(t, "demo", "failover", "--preset", "small", "--kill-after", "60", "--max-tokens", "200", "--seed", "5")
	if err != nil || !strings.Contains(out, "bit-identical: yes") || !strings.Contains(out, "migrations: 1") {
		t.Fatalf("demo failover: %v\n%s\n%s", err, out, errOut)
	}
	t.Log("\n" + out)
}
