package worker

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestWorkerDecodesWhileAgentFrozen: the node agent, which owns the KV
// arena, is frozen (SIGSTOP) mid-stream for longer than its KV lease. The
// worker is not held up by it: tokens keep coming during the freeze, and
// the stream completes bit-identical to a fault-free run, on the same
// worker. Once the agent resumes, a new request is served with arena KV
// again (its prompt's blocks are reused from the arena).
func TestWorkerDecodesWhileAgentFrozen(t *testing.T) {
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.LeaseTTL = agent.Duration(2 * time.Second)
		o.CanaryIdle = agent.Duration(time.Hour)
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", Count: 1, StepInterval: agent.Duration(clustertest.PacedStep)}}
		o.ArenaSlotBytes = 131072
	})
	url := clustertest.StartFrontend(t, n)
	// 1,200 paced tokens take 6 s at least: the stream outlasts the 3 s
	// freeze.
	body := map[string]any{"model": "tiny", "prompt": "The lighthouse keeper", "max_tokens": 1200, "temperature": 0.9, "seed": 21, "stream": true, "ignore_eos": true}
	want, _ := clustertest.StreamCompletion(t, url, body, nil)

	p := n.Process()
	t.Cleanup(func() { p.Signal(syscall.SIGCONT) })
	var seen atomic.Int64
	type result struct {
		toks []clustertest.Token
		last map[string]any
		err  error
	}
	done := make(chan result, 1)
	go func() {
		toks, last, err := clustertest.Stream(url, body, func(clustertest.Token) { seen.Add(1) })
		done <- result{toks, last, err}
	}()
	proctest.WaitFor(t, 30*time.Second, "the stream to be under way", func() (bool, string) {
		return seen.Load() >= 20, fmt.Sprint(seen.Load())
	})
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	at := seen.Load()
	proctest.WaitFor(t, 20*time.Second, "tokens while the agent is frozen", func() (bool, string) {
		return seen.Load() >= at+100 || int(seen.Load()) == len(want), fmt.Sprint(seen.Load())
	})
	// Hold the freeze past the KV lease (2 s) and check the stream still
	// moves at its end.
	if d := 3*time.Second - time.Since(frozen); d > 0 {
		<-time.After(d) // the freeze's length, not a wait for an event
	}
	late := seen.Load()
	proctest.WaitFor(t, 10*time.Second, "tokens after the KV lease expired", func() (bool, string) {
		return seen.Load() > late || int(seen.Load()) == len(want), fmt.Sprint(seen.Load())
	})
	t.Logf("frozen %v: stream went from %d to %d tokens", time.Since(frozen).Round(time.Millisecond), at, seen.Load())
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if len(got.toks) != len(want) {
		t.Fatalf("%d tokens, want %d; last %v", len(got.toks), len(want), got.last)
	}
	for i := range want {
		if got.toks[i].TokenID != want[i].TokenID || got.toks[i].Text != want[i].Text {
			t.Fatalf("token %d differs: %+v, want %+v", i+1, got.toks[i], want[i])
		}
		if got.toks[i].Instance != want[0].Instance {
			t.Fatalf("token %d from %s: the stream migrated off %s", i+1, got.toks[i].Instance, want[0].Instance)
		}
	}
	if m := lifeline(got.last, "migrations"); m != 0 {
		t.Fatalf("the stream migrated %v times: %v", m, got.last)
	}
	// Resumed: the agent registers again, and a request publishes its
	// prompt's blocks to the arena, where the next one reuses them.
	n.WaitRegistration(t, n.Options.NodeID+"-decode-tiny-0", 0)
	again := map[string]any{"model": "tiny", "prompt": "After the freeze the keeper climbed the stairs of the old lighthouse and lit the lamp again, as every night",
		"max_tokens": 4, "stream": true, "ignore_eos": true}
	proctest.WaitFor(t, 30*time.Second, "a request served with arena KV after the freeze", func() (bool, string) {
		_, last, err := clustertest.Stream(url, again, nil)
		return err == nil && lifeline(last, "kv_reused_positions") > 0, fmt.Sprint(last, err)
	})
}

// lifeline reads a number from the lifeline object of a final chunk (-1
// when it does not say).
func lifeline(last map[string]any, field string) float64 {
	if m, ok := last["lifeline"].(map[string]any); ok {
		if v, ok := m[field].(float64); ok {
			return v
		}
	}
	return -1
}
