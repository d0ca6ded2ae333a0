package e2e

import (
	"fmt"
	"math"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// Output lengths of the short and the long stream of
// TestAgentDrainDecidesPerRequest: the short one must still be running
// once nodectl began the drain (a worker on one core steps in ~4 ms
// here: 300 tokens last over a second).
const shortTokens, longTokens = 300, 3200

// drainDecisionOverhead is about how long a drain takes from nodectl to
// the workers' decisions (not-ready, the settle, the Admin call).
const drainDecisionOverhead = 600 * time.Millisecond

// drainDeadlineBetween measures the step time of the instance's worker
// as the worker's drain will (the mean of its last 64 steps; the median of
// five looks 100 ms apart) and returns a drain deadline that n remaining
// tokens fit with the drain margin when n is about the geometric mean of
// short and long: a short request fits it, and a long one does not,
// unless the step time changes by more than sqrt(long/short) between this
// look and the worker's decision.
func drainDeadlineBetween(t *testing.T, node *clustertest.Node, id string, short, long int) time.Duration {
	t.Helper()
	c := node.DialWorker(t, id)
	var looks []time.Duration
	for i := range 5 {
		if i > 0 {
			time.Sleep(100 * time.Millisecond) // spread the looks over more steps
		}
		h, err := c.Health(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		looks = append(looks, time.Duration(h.MeanStepTimeUs)*time.Microsecond)
	}
	slices.Sort(looks)
	step := looks[len(looks)/2]
	if step == 0 {
		t.Fatalf("worker %s reports no step time while it streams", id)
	}
	mean := math.Sqrt(float64(short) * float64(long))
	deadline := (time.Duration(float64(step)*mean*sched.DrainMargin) + drainDecisionOverhead).Round(time.Millisecond)
	t.Logf("step time %v (looks %v): drain deadline %v", step, looks, deadline)
	return deadline
}

// seenToken is a streamed token with when and from where it came.
type seenToken struct {
	clustertest.Token
	at time.Time
}

// liveStream is a streaming request running on its own goroutine.
type liveStream struct {
	first chan string // the instance of its first token
	done  chan struct{}
	toks  []seenToken
	err   error
}

func startLiveStream(url string, body map[string]any) *liveStream {
	s := &liveStream{first: make(chan string, 1), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_, _, s.err = clustertest.Stream(url, body, func(tok clustertest.Token) {
			if len(s.toks) == 0 {
				s.first <- tok.Instance
			}
			s.toks = append(s.toks, seenToken{tok, time.Now()})
		})
	}()
	return s
}

// check waits for the stream and compares it with an undisturbed run; it
// returns the instances it came from, in order, and when each took over.
func (s *liveStream) check(t *testing.T, name string, want []clustertest.Token) (instances []string, at []time.Time) {
	t.Helper()
	<-s.done
	if s.err != nil {
		t.Fatalf("%s stream: %v", name, s.err)
	}
	if len(s.toks) != len(want) {
		t.Fatalf("%s stream: %d tokens, undisturbed %d", name, len(s.toks), len(want))
	}
	for i, got := range s.toks {
		if got.Seq != want[i].Seq || got.TokenID != want[i].TokenID || got.Text != want[i].Text {
			t.Fatalf("%s stream: token %d: %+v, undisturbed %+v", name, i, got.Token, want[i])
		}
		if i == 0 || got.Instance != s.toks[i-1].Instance {
			instances, at = append(instances, got.Instance), append(at, got.at)
		}
	}
	return instances, at
}

// TestAgentDrainDecidesPerRequest: `nodectl drain` of a node serving a
// short seeded stream and a long one, with a deadline that the short
// one's remaining tokens fit at the worker's step time (with the margin)
// and the long one's do not, by about three times either way (the step
// time is measured just before: it varies with the machine's load). The
// short one finishes in place, never migrating; the long one is moved at
// once — well before the deadline — through the frontend's migration,
// once. Both are bit-identical to undisturbed runs, the node is drained
// before the deadline, and its drain status and metrics count one request
// finished in place and one moved early, none ended at the deadline.
func TestAgentDrainDecidesPerRequest(t *testing.T) {
	t.Parallel()
	c := newDrainCluster(t, func(o *clustertest.Config) { o.DrainSettle = agent.Duration(200 * time.Millisecond) })
	body := func(prompt string, n, seed int) map[string]any {
		return map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": n, "seed": seed, "temperature": 0.9,
			"stream": true, "ignore_eos": true}
	}
	long, short := body("The night train to the coast", longTokens, 21), body("A small boat", shortTokens, 5)
	var wantLong, wantShort []clustertest.Token
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); wantLong, _, _ = clustertest.Stream(c.url, long, nil) }()
	go func() { defer wg.Done(); wantShort, _, _ = clustertest.Stream(c.url, short, nil) }()
	wg.Wait()
	if len(wantLong) != longTokens || len(wantShort) != shortTokens {
		t.Fatalf("undisturbed runs: %d and %d tokens", len(wantLong), len(wantShort))
	}

	longRun := startLiveStream(c.url, long)
	served := <-longRun.first
	node := c.nodes[served]
	// The step time is looked at before the short stream starts, so
	// that the drain begins as soon as it runs.
	deadline := drainDeadlineBetween(t, node, served, shortTokens, longTokens)
	// The router balances load: short streams go on until one lands on
	// the long one's node (the others are checked too).
	var shortRun *liveStream
	var elsewhere []*liveStream
	for range 4 {
		s := startLiveStream(c.url, short)
		if <-s.first == served {
			shortRun = s
			break
		}
		elsewhere = append(elsewhere, s)
	}
	if shortRun == nil {
		t.Fatalf("no short stream routed to %s in 4 tries", served)
	}
	began := time.Now()
	out, err := exec.Command(proctest.Nodectl(t), "--socket", node.Options.Socket, "drain", "--deadline", deadline.String(),
		"--hard-deadline", (deadline + 30*time.Second).String()).CombinedOutput()
	if err != nil {
		t.Fatalf("nodectl drain: %v\n%s", err, out)
	}
	t.Logf("nodectl drain:\n%s", out)
	for _, line := range strings.Split(node.Log.String(), "\n") {
		if strings.Contains(line, ": drain: ") {
			t.Logf("worker decision: %s", line)
		}
	}

	insts, at := longRun.check(t, "long", wantLong)
	if len(insts) != 2 || insts[0] != served {
		t.Fatalf("long stream came from %v: want %s, then one migration", insts, served)
	}
	if moved := at[1].Sub(began); moved > deadline/2 {
		t.Fatalf("long stream moved %v after the drain began: not at once (deadline %v)", moved, deadline)
	} else {
		t.Logf("long stream moved %v after the drain began (deadline %v)", moved, deadline)
	}
	if insts, _ := shortRun.check(t, "short", wantShort); len(insts) != 1 || insts[0] != served {
		t.Fatalf("short stream came from %v: want %s only (finished in place)", insts, served)
	}
	for i, s := range elsewhere {
		s.check(t, fmt.Sprintf("short #%d (another node)", i), wantShort)
	}
	st := node.NodectlStatus(t)
	d := st.Drain
	if d == nil || d.Phase != controlapi.DrainDrained || d.ActiveAtStart != 2 || d.FinishedInPlace != 1 || d.MovedEarly != 1 ||
		d.EndedAtDeadline != 0 || d.ForcedEnded != 1 || d.RoutedAfterNotReady != 0 {
		t.Fatalf("drain status: %+v", d)
	}
	if took := d.DrainedAt.Sub(d.StartedAt); took >= deadline {
		t.Fatalf("drained in %v: past its deadline", took)
	}
	if !strings.Contains(string(out), "1 moved early") {
		t.Errorf("nodectl drain output does not count the request moved early")
	}
	metrics := scrape(t, c.metrics[served])
	for _, want := range []string{`lifeline_agent_drain_requests_total{outcome="finished_in_place"} 1`,
		`lifeline_agent_drain_requests_total{outcome="moved_early"} 1`, `lifeline_agent_drain_requests_total{outcome="ended_at_deadline"} 0`,
		"lifeline_agent_drain_requests_forced_total 1"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics of the drained node lack %s", want)
		}
	}
	clustertest.NoOrphans(t, c.nodes["n1-decode-tiny-0"], c.nodes["n2-decode-tiny-0"])
}
