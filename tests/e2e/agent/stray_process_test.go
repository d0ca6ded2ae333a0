package e2e

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/internal/procfs"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestAgentRestartEndsAWorkerNobodyRecorded: the agent is SIGKILLed while
// its worker is up but has not announced it serves (a failpoint holds it
// before its Ready line), so no record names it and the restarted agent
// cannot adopt it. The restarted agent ends it before it starts the
// instance's next generation, and says so in its events. It used to run
// on beside its successor for good: the restarted agent's socket
// answering, it never counted as an orphan (a soak drill found one).
func TestAgentRestartEndsAWorkerNobodyRecorded(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.ExtraEnv = []string{"LIFELINE_FAILPOINTS=worker.before-ready=pause"}
	})
	const id = "n1-decode-tiny-0"
	var stray procfs.Process
	proctest.WaitFor(t, time.Minute, "the worker held before its Ready line", func() (bool, string) {
		ps := workerProcesses(n, id)
		if len(ps) == 1 && strings.Contains(n.Log.String(), "failpoint worker.before-ready hit") {
			stray = ps[0]
			return true, ""
		}
		return false, n.Log.String()
	})
	// A failed run leaves no process behind: the held worker waits at its
	// failpoint for good.
	t.Cleanup(func() {
		for _, p := range workerProcesses(n, id) {
			if p.PID == stray.PID {
				syscall.Kill(p.PID, syscall.SIGKILL)
			}
		}
	})
	n.Process().Kill()
	<-n.Exited()
	n.ExtraEnv = nil
	n.Restart(t)
	reg := n.WaitRegistration(t, id, 0)
	for _, p := range workerProcesses(n, id) {
		if p.PID == stray.PID {
			t.Fatalf("the worker nobody recorded (pid %d) runs on beside generation %d; agent log:\n%s", stray.PID, reg.Generation, n.Log.String())
		}
	}
	if ps := workerProcesses(n, id); len(ps) != 1 {
		t.Fatalf("%d worker processes of %s, want 1: %v", len(ps), id, ps)
	}
	var ended *controlapi.Event
	for _, e := range proctest.JSONLines[controlapi.Event](t, n.Nodectl(t, "events")) {
		if e.Kind == controlapi.EventStrayEnded {
			ended = &e
		}
	}
	if ended == nil || ended.InstanceID != id || ended.PID != stray.PID {
		t.Fatalf("no stray_ended event for pid %d: %+v", stray.PID, ended)
	}
}

// TestAgentRestartEndsAWorkerItFailsToAdopt: the restarted agent finds
// its predecessor's worker recorded and alive, but cannot watch it (the
// failpoint stands for the exit detector refusing, as a full eBPF map
// would), so the adoption fails. A worker nobody watches is not the
// agent's: it is SIGKILLed and said so before the next generation starts,
// never left to serve beside it.
func TestAgentRestartEndsAWorkerItFailsToAdopt(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t)
	const id = "n1-decode-tiny-0"
	first := n.WaitRegistration(t, id, 0)
	ps := workerProcesses(n, id)
	if len(ps) != 1 {
		t.Fatalf("%d worker processes of %s, want 1: %v", len(ps), id, ps)
	}
	recorded := ps[0]
	n.Process().Kill()
	<-n.Exited()
	n.ExtraEnv = []string{"LIFELINE_FAILPOINTS=" + agent.FailAdoptWatch + "=error"}
	n.Restart(t)
	next := n.WaitRegistration(t, id, first.Generation)
	proctest.WaitFor(t, 30*time.Second, "the worker it failed to adopt gone", func() (bool, string) {
		for _, p := range workerProcesses(n, id) {
			if p.PID == recorded.PID {
				return false, n.Log.String()
			}
		}
		return true, ""
	})
	if ps := workerProcesses(n, id); len(ps) != 1 {
		t.Fatalf("%d worker processes of %s beside generation %d, want 1: %v", len(ps), id, next.Generation, ps)
	}
	if !strings.Contains(n.Log.String(), "cannot watch adopted worker") {
		t.Fatalf("the agent never tried to adopt pid %d; agent log:\n%s", recorded.PID, n.Log.String())
	}
	var ended *controlapi.Event
	for _, e := range proctest.JSONLines[controlapi.Event](t, n.Nodectl(t, "events")) {
		if e.Kind == controlapi.EventStrayEnded && e.PID == recorded.PID {
			ended = &e
		}
		if e.Kind == controlapi.EventAdopted {
			t.Fatalf("an adopted event though the watch failed: %+v", e)
		}
	}
	if ended == nil || ended.InstanceID != id {
		t.Fatalf("no stray_ended event for the worker it failed to adopt (pid %d): %+v", recorded.PID, ended)
	}
}

// workerProcesses are the live worker processes of instance id started by
// n's agent (by their command lines).
func workerProcesses(n *clustertest.Node, id string) []procfs.Process {
	var out []procfs.Process
	for _, p := range procfs.List() {
		args := p.Args()
		if slices.Contains(args, "--agent-socket="+n.Options.Socket) && slices.Contains(args, "--instance-id="+id) {
			out = append(out, p)
		}
	}
	return out
}
