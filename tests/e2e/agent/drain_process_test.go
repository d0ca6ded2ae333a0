package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/debugsock"
	"github.com/lifeline-llm/lifeline/internal/tracing"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// drainCluster is two nodes of one paced tiny decode instance each and a
// frontend, and a seeded long request's tokens from an undisturbed run.
type drainCluster struct {
	nodes   map[string]*clustertest.Node // by instance id
	metrics map[string]string            // metrics address, by instance id
	url     string
	body    map[string]any
	want    []clustertest.Token
}

// drainTokens is the length of a drain test's stream: long enough that
// it is still running, far from its end, once nodectl (a process started
// at its first token, seconds later on a loaded machine) began the drain.
const drainTokens = 1000

func newDrainCluster(t *testing.T, opts ...clustertest.Option) *drainCluster {
	t.Helper()
	paced := func(o *clustertest.Config) {
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", Count: 1, StepInterval: agent.Duration(clustertest.PacedStep)}}
		o.DrainSettle = agent.Duration(500 * time.Millisecond)
	}
	m1, m2 := proctest.FreeTCPAddr(t), proctest.FreeTCPAddr(t)
	n1 := clustertest.NewNode(t, append([]clustertest.Option{paced, func(o *clustertest.Config) { o.Metrics = m1 }}, opts...)...)
	n2 := clustertest.Peer(t, n1, "n2", append([]clustertest.Option{paced, func(o *clustertest.Config) { o.Metrics = m2 }}, opts...)...)
	c := &drainCluster{nodes: map[string]*clustertest.Node{"n1-decode-tiny-0": n1, "n2-decode-tiny-0": n2},
		metrics: map[string]string{"n1-decode-tiny-0": m1, "n2-decode-tiny-0": m2}}
	for id, n := range c.nodes {
		n.WaitRegistration(t, id, 0)
	}
	c.url = clustertest.StartFrontend(t, n1)
	c.body = map[string]any{"model": "tiny", "prompt": "The lighthouse keeper wrote", "max_tokens": drainTokens, "seed": 9, "temperature": 0.9,
		"stream": true, "ignore_eos": true}
	c.want, _ = clustertest.StreamCompletion(t, c.url, c.body, nil)
	if len(c.want) != drainTokens {
		t.Fatalf("undisturbed run: %d tokens", len(c.want))
	}
	return c
}

// flipWatch records when each instance's registration was first written
// with draining set.
type flipWatch struct {
	mu      sync.Mutex
	flipped map[string]time.Time
}

func watchFlips(t *testing.T, cli *clientv3.Client) *flipWatch {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &flipWatch{flipped: map[string]time.Time{}}
	ch := cli.Watch(ctx, schema.InstancesPrefix, clientv3.WithPrefix())
	go func() {
		for wr := range ch {
			for _, ev := range wr.Events {
				var r schema.Registration
				if ev.Type == clientv3.EventTypePut && json.Unmarshal(ev.Kv.Value, &r) == nil && r.Draining {
					w.mu.Lock()
					if _, ok := w.flipped[r.InstanceID]; !ok {
						w.flipped[r.InstanceID] = time.Now()
					}
					w.mu.Unlock()
				}
			}
		}
	}()
	return w
}

func (w *flipWatch) at(id string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.flipped[id]
}

// streamDisturbed runs the cluster's request; at its first token, disturb
// is called (on its own goroutine) with the instance serving it. It
// returns that instance and when the stream first came from another.
func (c *drainCluster) streamDisturbed(t *testing.T, disturb func(instance string)) (served string, moved time.Time) {
	t.Helper()
	got, last := clustertest.StreamCompletion(t, c.url, c.body, func(tok clustertest.Token) {
		switch {
		case served == "":
			served = tok.Instance
			go disturb(served)
		case tok.Instance != served && moved.IsZero():
			moved = time.Now()
		}
	})
	if len(got) != len(c.want) {
		t.Fatalf("disturbed stream: %d tokens, want %d; last chunk %v", len(got), len(c.want), last)
	}
	for i := range got {
		if got[i].Seq != c.want[i].Seq || got[i].TokenID != c.want[i].TokenID || got[i].Text != c.want[i].Text {
			t.Fatalf("token %d: %+v, undisturbed %+v", i, got[i], c.want[i])
		}
	}
	return served, moved
}

// TestAgentDrainMigratesStream: `nodectl drain --deadline 1s` of the node
// serving a long seeded stream through a frontend. Its registration is
// marked draining before the stream moves; the worker ends the stream
// (too long for the deadline, it moves at once) with a retryable draining
// error and the frontend migrates it: the client's tokens are bit-identical to an undisturbed
// run. nodectl waits, printing progress, until the node is drained: its
// workers stopped, its registration gone, the agent up. `nodectl
// undrain` brings the instance back at a new generation and gives the
// disruption budget back.
func TestAgentDrainMigratesStream(t *testing.T) {
	t.Parallel()
	c := newDrainCluster(t)
	flips := watchFlips(t, c.nodes["n1-decode-tiny-0"].Env.Client)
	var (
		drainOut []byte
		drainErr error
		drained  = make(chan struct{})
		node     *clustertest.Node
	)
	served, moved := c.streamDisturbed(t, func(instance string) {
		defer close(drained)
		node = c.nodes[instance]
		drainOut, drainErr = exec.Command(proctest.Nodectl(t), "--socket", node.Options.Socket, "drain", "--deadline", "1s", "--hard-deadline", "30s").CombinedOutput()
	})
	<-drained
	if drainErr != nil {
		t.Fatalf("nodectl drain: %v\n%s", drainErr, drainOut)
	}
	t.Logf("nodectl drain:\n%s", drainOut)
	flipped := flips.at(served)
	if flipped.IsZero() || moved.IsZero() || !flipped.Before(moved) {
		t.Fatalf("registration of %s marked draining at %v, stream moved at %v: the flip must come first", served, flipped, moved)
	}
	t.Logf("marked draining %v before the stream moved", moved.Sub(flipped))
	for _, want := range []string{"not_ready", "in_flight", "drained in", "1 ended by the deadline"} {
		if !strings.Contains(string(drainOut), want) {
			t.Errorf("nodectl drain output lacks %q", want)
		}
	}
	st := node.NodectlStatus(t)
	if st.Drain == nil || st.Drain.Phase != controlapi.DrainDrained || st.Drain.ForcedEnded != 1 || st.Drain.ActiveAtStart != 1 ||
		!st.Drain.BudgetHeld || st.Instances[0].State != "drained" || st.Instances[0].PID != 0 {
		t.Fatalf("status after the drain: %+v %+v", st.Drain, st.Instances)
	}
	if out := node.Nodectl(t, "status"); !strings.Contains(out, "drain (nodectl): drained") {
		t.Fatalf("nodectl status does not show the drain:\n%s", out)
	}
	if resp, err := node.Env.Client.Get(t.Context(), schema.InstancesPrefix+served); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("registration of the drained instance: %v %v", resp, err)
	}
	clustertest.NoOrphans(t, c.nodes["n1-decode-tiny-0"], c.nodes["n2-decode-tiny-0"])
	metrics := scrape(t, c.metrics[served])
	for _, want := range []string{`lifeline_agent_drains_total{trigger="nodectl"} 1`, "lifeline_agent_drain_duration_seconds_count 1",
		`lifeline_agent_drain_active_requests{at="start"} 1`, `lifeline_agent_drain_active_requests{at="end"} 0`,
		"lifeline_agent_drain_requests_forced_total 1", "lifeline_agent_drain_routed_after_not_ready_total 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics of the drained node lack %s", want)
		}
	}

	// The drain is traced: a span of it, and one per step, in order.
	spans, err := tracing.Fetch(t.Context(), debugsock.Base(node.Options.Socket), "node_id", node.Options.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, sp := range spans {
		if strings.HasPrefix(sp.Name, "lifeline.drain") {
			steps = append(steps, sp.Name)
		}
	}
	// Spans are kept as they end: each step before the drain's.
	if got := strings.Join(steps, " "); got != "lifeline.drain.budget lifeline.drain.not_ready lifeline.drain.settle lifeline.drain.in_flight lifeline.drain.stop lifeline.drain" {
		t.Errorf("drain spans: %s", got)
	}

	gen := st.Instances[0].Generation
	if out := node.Nodectl(t, "undrain"); !strings.Contains(out, "undraining") {
		t.Fatalf("nodectl undrain: %s", out)
	}
	next := node.WaitRegistration(t, served, gen)
	proctest.WaitFor(t, 30*time.Second, "the disruption budget given back", func() (bool, string) {
		resp, err := node.Env.Client.Get(t.Context(), schema.DrainHoldersPrefix, clientv3.WithPrefix())
		st, serr := node.Status(t.Context())
		return err == nil && len(resp.Kvs) == 0 && serr == nil && st.Drain == nil, fmt.Sprintf("holders %v, drain %+v", resp, st.Drain)
	})
	if _, err := nodectl.Undrain(t.Context(), node.Options.Socket); !errors.Is(err, controlapi.ErrNotDrained) {
		t.Fatalf("undrain of a node not drained: %v", err)
	}
	t.Logf("undrained: %s back at generation %d (was %d)", served, next.Generation, gen)
}

// TestAgentSIGTERMDrains: SIGTERM to the agent serving a long seeded
// stream runs the same drain (deadline 1 s): the registration is marked
// draining before the stream moves, the stream finishes bit-identical on
// the other node, and the agent exits well before its hard deadline, its
// worker stopped.
func TestAgentSIGTERMDrains(t *testing.T) {
	t.Parallel()
	c := newDrainCluster(t, func(o *clustertest.Config) {
		o.DrainDeadline, o.DrainHardDeadline = agent.Duration(time.Second), agent.Duration(20*time.Second)
	})
	flips := watchFlips(t, c.nodes["n1-decode-tiny-0"].Env.Client)
	var (
		node    *clustertest.Node
		pid     int
		termed  time.Time
		stopped = make(chan time.Duration, 1)
	)
	served, moved := c.streamDisturbed(t, func(instance string) {
		node = c.nodes[instance]
		ws, err := node.Workers(context.Background())
		if err == nil && len(ws) == 1 {
			pid = ws[0].PID
		}
		termed = time.Now()
		node.Signal(syscall.SIGTERM)
		<-node.Exited()
		stopped <- time.Since(termed)
	})
	took := <-stopped
	flipped := flips.at(served)
	if flipped.IsZero() || moved.IsZero() || !flipped.Before(moved) {
		t.Fatalf("registration of %s marked draining at %v, stream moved at %v: the flip must come first", served, flipped, moved)
	}
	t.Logf("SIGTERM → marked draining %v → stream moved %v → agent exited %v", flipped.Sub(termed), moved.Sub(termed), took)
	if took >= 20*time.Second {
		t.Fatalf("agent exited %v after SIGTERM: past its hard deadline", took)
	}
	if pid == 0 || syscall.Kill(pid, 0) == nil {
		t.Fatalf("worker %d survived the agent's drain", pid)
	}
	if !strings.Contains(node.Log.String(), `"phase":"drained"`) {
		t.Fatalf("agent log has no drained phase:\n%s", node.Log.String())
	}
}

// TestAgentDrainBudget: with max_unavailable 1 (the default), a second
// node's drain waits while the first is drained and goes ahead once the
// first is undrained and ready again; `--no-wait` refuses it with a
// message naming the holder.
func TestAgentDrainBudget(t *testing.T) {
	t.Parallel()
	fast := func(o *clustertest.Config) { o.DrainSettle = agent.Duration(100 * time.Millisecond) }
	n1 := clustertest.NewNode(t, fast)
	n2 := clustertest.Peer(t, n1, "n2", fast)
	reg1 := n1.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n2.WaitRegistration(t, "n2-decode-tiny-0", 0)
	if _, err := nodectl.Undrain(t.Context(), n2.Options.Socket); !errors.Is(err, controlapi.ErrNotDrained) {
		t.Fatalf("undrain of a node not drained: %v", err)
	}
	for _, args := range [][]string{{"--deadline", "soon"}, {"--deadline", "30s", "--hard-deadline", "20s"}} {
		out, err := exec.Command(proctest.Nodectl(t), append([]string{"--socket", n2.Options.Socket, "drain"}, args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "deadline") {
			t.Fatalf("drain %v: %v %s", args, err, out)
		}
	}
	if _, err := nodectl.Drain(t.Context(), n2.Options.Socket, controlapi.DrainRequest{HardDeadline: "-3s"}); !errors.Is(err, controlapi.ErrBadRequest) {
		t.Fatalf("drain with a negative hard deadline: %v", err)
	}
	if out := n1.Nodectl(t, "drain", "--detach"); !strings.Contains(out, "drain (nodectl)") {
		t.Fatalf("nodectl drain --detach: %s", out)
	}
	phase := func(n *clustertest.Node) (string, string) {
		st, err := n.Status(t.Context())
		if err != nil || st.Drain == nil {
			return "", fmt.Sprint(err)
		}
		return st.Drain.Phase, st.Drain.Detail
	}
	proctest.WaitFor(t, 30*time.Second, "n1 drained", func() (bool, string) {
		p, d := phase(n1)
		return p == controlapi.DrainDrained, p + " " + d
	})
	out, err := exec.Command(proctest.Nodectl(t), "--socket", n2.Options.Socket, "drain", "--no-wait").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "disruption budget is taken") || !strings.Contains(string(out), "n1 (nodectl") {
		t.Fatalf("drain --no-wait while n1 holds the budget: %v\n%s", err, out)
	}
	if p, _ := phase(n2); p != "" {
		t.Fatalf("a refused drain left phase %q", p)
	}
	n2.Nodectl(t, "drain", "--detach")
	proctest.WaitFor(t, 10*time.Second, "n2 waiting for the budget", func() (bool, string) {
		p, d := phase(n2)
		return p == controlapi.DrainWaitingForBudget && strings.Contains(d, "held by n1"), p + " " + d
	})
	proctest.Never(t, time.Second, "n2 draining while n1 holds the budget", func() (bool, string) {
		p, d := phase(n2)
		return p != controlapi.DrainWaitingForBudget, p + " " + d
	})
	if w := n2.NodectlWorkers(t)[0]; !w.Ready {
		t.Fatalf("n2's instance while its drain waits: %+v", w)
	}
	n1.Nodectl(t, "undrain")
	n1.WaitRegistration(t, "n1-decode-tiny-0", reg1.Generation)
	proctest.WaitFor(t, 30*time.Second, "n2 drained once n1 is back", func() (bool, string) {
		p, d := phase(n2)
		return p == controlapi.DrainDrained, p + " " + d
	})
	if p, _ := phase(n1); p != "" {
		t.Fatalf("n1 after its undrain: phase %q", p)
	}
	resp, err := n1.Env.Client.Get(t.Context(), schema.DrainHoldersPrefix, clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || !strings.HasSuffix(string(resp.Kvs[0].Key), "/n2") {
		t.Fatalf("budget holders with n2 drained: %v %v", resp, err)
	}
	n2.Nodectl(t, "undrain")
	n2.WaitRegistration(t, "n2-decode-tiny-0", 0)
}
