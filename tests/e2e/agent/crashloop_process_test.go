package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// flakyWorker is a worker binary that exits 1 on its first fails starts
// and is the real worker after that.
func flakyWorker(t *testing.T, fails int) string {
	t.Helper()
	dir := t.TempDir()
	script, counter := filepath.Join(dir, "flaky-worker"), filepath.Join(dir, "starts")
	body := fmt.Sprintf("#!/bin/sh\nn=$(cat %s 2>/dev/null || echo 0)\necho $((n+1)) > %s\n[ $n -lt %d ] && exit 1\nexec %s \"$@\"\n",
		counter, counter, fails, proctest.Lifeline(t))
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}

// crashLoopNode runs a node whose worker fails its first fails starts;
// three exits within a minute make a crash loop.
func crashLoopNode(t *testing.T, fails int, cooldown, cooldownMax time.Duration) *clustertest.Node {
	return clustertest.NewNode(t, func(o *clustertest.Config) {
		o.WorkerBinary, o.CrashLoopLimit, o.CrashLoopWindow = flakyWorker(t, fails), 2, agent.Duration(time.Minute)
		o.RestartBackoff, o.RestartMax = agent.Duration(10*time.Millisecond), agent.Duration(20*time.Millisecond)
		o.CrashLoopCooldown, o.CrashLoopCooldownMax = agent.Duration(cooldown), agent.Duration(cooldownMax)
	})
}

// events of kind on instance, in order.
func eventsOf(t *testing.T, n *clustertest.Node, instance string, kinds ...string) []controlapi.Event {
	var out []controlapi.Event
	for _, e := range proctest.JSONLines[controlapi.Event](t, n.Nodectl(t, "events")) {
		for _, k := range kinds {
			if e.Kind == k && e.InstanceID == instance {
				out = append(out, e)
			}
		}
	}
	return out
}

// TestAgentCrashLoopCoolsDown: a worker that fails six starts in a row
// makes two crash loops. Each ends after its cool-down (1 s, then 2 s:
// doubled for the second in a row) with a new attempt, the status says
// when that attempt is due while it waits, and the seventh start serves.
func TestAgentCrashLoopCoolsDown(t *testing.T) {
	t.Parallel()
	const id = "n1-decode-tiny-0"
	n := crashLoopNode(t, 6, time.Second, time.Hour)
	var seen controlapi.Worker
	proctest.WaitFor(t, 30*time.Second, "the instance in crash_loop with its next attempt due", func() (bool, string) {
		st, err := n.Status(t.Context())
		if err == nil && len(st.Instances) == 1 && st.Instances[0].State == "crash_loop" {
			seen = st.Instances[0]
		}
		return !seen.NextAttempt.IsZero(), fmt.Sprintf("%+v %v", st.Instances, err)
	})
	if d := time.Until(seen.NextAttempt); d > 2*time.Second || seen.CrashLoops < 1 {
		t.Fatalf("in crash_loop: next attempt in %v, crash loops %d", d, seen.CrashLoops)
	}
	reg := n.WaitRegistration(t, id, 0)
	// Every crash loop was followed by a retry, no sooner than its
	// cool-down after it, then by a start.
	evs := eventsOf(t, n, id, controlapi.EventCrashLoop, controlapi.EventRetry, controlapi.EventStarted)
	var loops, retries []controlapi.Event
	for i, e := range evs {
		switch e.Kind {
		case controlapi.EventCrashLoop:
			loops = append(loops, e)
		case controlapi.EventRetry:
			retries = append(retries, e)
			if i+1 >= len(evs) || evs[i+1].Kind != controlapi.EventStarted {
				t.Fatalf("retry not followed by a start: %+v", evs)
			}
		}
	}
	if len(loops) != 2 || len(retries) != 2 {
		t.Fatalf("crash loops %d, retries %d; events %+v", len(loops), len(retries), evs)
	}
	for i, cool := range []time.Duration{time.Second, 2 * time.Second} {
		if waited := retries[i].Time.Sub(loops[i].Time); waited < cool || waited > cool+5*time.Second {
			t.Errorf("crash loop %d: retried after %v, want its %v cool-down", i+1, waited, cool)
		}
		if retries[i].Detail != "cool-down over" {
			t.Errorf("retry %d: %q", i+1, retries[i].Detail)
		}
	}
	if w := n.NodectlWorkers(t)[0]; w.State != "running" || !w.NextAttempt.IsZero() || w.Generation != reg.Generation || !w.Ready {
		t.Fatalf("after the crash loops: %+v", w)
	}
}

// TestAgentCrashLoopReset: with an hour's cool-down, `nodectl reset`
// tries a crash-looping instance again at once; a reset of an unknown
// instance, or of one not in crash_loop, is refused with a typed error.
func TestAgentCrashLoopReset(t *testing.T) {
	t.Parallel()
	const id = "n1-decode-tiny-0"
	n := crashLoopNode(t, 3, time.Hour, 2*time.Hour)
	proctest.WaitFor(t, 30*time.Second, "the instance in crash_loop", func() (bool, string) {
		ws, err := n.Workers(t.Context())
		return err == nil && len(ws) == 1 && ws[0].State == "crash_loop", fmt.Sprintf("%+v %v", ws, err)
	})
	w := n.NodectlWorkers(t)[0]
	if d := time.Until(w.NextAttempt); d < 59*time.Minute {
		t.Fatalf("next attempt in %v, want about an hour", d)
	}
	if out := n.Nodectl(t, "status"); !strings.Contains(out, "crash_loop (next attempt") {
		t.Fatalf("status does not say when the next attempt is due:\n%s", out)
	}
	ctx := t.Context()
	if _, err := nodectl.Reset(ctx, n.Options.Socket, "n1-nope-0"); !errors.Is(err, controlapi.ErrUnknownInstance) {
		t.Fatalf("reset of an unknown instance: %v", err)
	}
	out, err := exec.Command(proctest.Nodectl(t), "--socket", n.Options.Socket, "reset", "--instance", "n1-nope-0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `no instance "n1-nope-0"`) {
		t.Fatalf("nodectl reset of an unknown instance: %v %s", err, out)
	}
	reset := time.Now()
	if out := n.Nodectl(t, "reset", "--instance", id); !strings.Contains(out, id) {
		t.Fatalf("nodectl reset: %s", out)
	}
	n.WaitRegistration(t, id, 0)
	t.Logf("reset → registered in %v", time.Since(reset))
	retries := eventsOf(t, n, id, controlapi.EventRetry)
	if len(retries) != 1 || retries[0].Detail != "reset by the operator" {
		t.Fatalf("retry events %+v", retries)
	}
	if _, err := nodectl.Reset(ctx, n.Options.Socket, id); !errors.Is(err, controlapi.ErrNotInCrashLoop) {
		t.Fatalf("reset of a running instance: %v", err)
	}
}
