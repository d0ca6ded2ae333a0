package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/embedetcd"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// runOptions configures an in-process agent on a fresh embedded etcd.
func runOptions(t *testing.T) (Options, *clientv3.Client) {
	t.Helper()
	dir := t.TempDir()
	certs, err := pki.InitIdentity(filepath.Join(dir, "certs"), pki.Agent("n1"))
	if err != nil {
		t.Fatal(err)
	}
	e, cli := testEtcd(t)
	return Options{NodeID: "n1", DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(dir, "agent.sock"), Metrics: "127.0.0.1:0",
		Etcd: []string{e.Endpoint}, CertDir: certs, ArenaPath: filepath.Join(dir, "arena"), ArenaSlots: 64, ArenaSlotBytes: 8192,
		Detector: "pidfd"}, cli
}

// testEtcd starts a plain embedded etcd and a client of it.
func testEtcd(t *testing.T) (*embedetcd.Server, *clientv3.Client) {
	t.Helper()
	e, err := embedetcd.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return e, cli
}

// agentGoroutines lists the goroutines that still run agent code. A
// goroutine the agent tracks counts as gone once only its tracking
// wrapper is left: Run's wait has seen it finish.
func agentGoroutines() []string {
	var out []string
	for _, g := range stacks() {
		for _, line := range strings.Split(g, "\n") {
			switch {
			case !strings.Contains(line, "lifeline/agent."),
				strings.Contains(line, "lifeline/agent.Test"), strings.Contains(line, "lifeline/agent.runUntil"), // this test
				strings.Contains(line, "lifeline/agent.(*Agent).track.func"),
				strings.HasPrefix(line, "created by github.com/lifeline-llm/lifeline/agent.(*Agent).track "):
				continue
			}
			out = append(out, g)
			break
		}
	}
	return out
}

// untrackedGoroutines lists the goroutines agent code started other than
// through track: Run would not wait for them.
func untrackedGoroutines() []string {
	var out []string
	for _, g := range stacks() {
		for _, line := range strings.Split(g, "\n") {
			if strings.HasPrefix(line, "created by github.com/lifeline-llm/lifeline/agent.") &&
				!strings.HasPrefix(line, "created by github.com/lifeline-llm/lifeline/agent.(*Agent).track ") &&
				!strings.HasPrefix(line, "created by github.com/lifeline-llm/lifeline/agent.runUntil") {
				out = append(out, g)
			}
		}
	}
	return out
}

// stacks is every goroutine's stack but the caller's.
func stacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Split(string(buf), "\n\n")[1:] // the first is the caller
}

// runUntil runs the agent until ready says so, checks that it started no
// goroutine it does not track, stops it, and checks that Run returned
// without an agent goroutine left running.
func runUntil(t *testing.T, opts Options, ready func() (bool, string)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, opts, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	proctest.WaitFor(t, 60*time.Second, "the agent to come up", func() (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		default:
		}
		return ready()
	})
	if left := untrackedGoroutines(); len(left) > 0 {
		t.Fatalf("%d goroutines started outside track:\n%s", len(left), strings.Join(left, "\n\n"))
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return 30s after its context ended")
	}
	if left := agentGoroutines(); len(left) > 0 {
		t.Fatalf("%d agent goroutines still running after Run returned:\n%s", len(left), strings.Join(left, "\n\n"))
	}
}

// TestRunStopsEveryGoroutine: every subsystem Run starts (KV service,
// transfer endpoint, lease loop, control socket, metrics, systemd
// notifier) has stopped when Run returns.
func TestRunStopsEveryGoroutine(t *testing.T) {
	opts, cli := runOptions(t)
	runUntil(t, opts, func() (bool, string) {
		resp, err := cli.Get(context.Background(), schema.NodesPrefix+"n1")
		if err != nil {
			return false, err.Error()
		}
		return len(resp.Kvs) == 1, "no node record yet"
	})
}

// TestRunStopsWorkerGoroutines: with a worker running, its supervisor,
// reaper, stdout reader and canary loop have stopped when Run returns,
// and so has the worker.
func TestRunStopsWorkerGoroutines(t *testing.T) {
	opts, _ := runOptions(t)
	opts.WorkerBinary = proctest.Lifeline(t)
	opts.Instances = []InstanceSpec{{Role: "decode", Preset: "tiny", Count: 1}}
	opts.CanaryIdle, opts.CanaryTimeout = Duration(100*time.Millisecond), Duration(2*time.Second)
	var pid int
	runUntil(t, opts, func() (bool, string) {
		ws, err := nodectl.Workers(context.Background(), opts.Socket)
		if err != nil || len(ws) != 1 {
			return false, fmt.Sprint(ws, err)
		}
		pid = ws[0].PID
		return ws[0].Ready, fmt.Sprintf("%+v", ws[0])
	})
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("worker %d still there after Run returned: %v", pid, err)
	}
}
