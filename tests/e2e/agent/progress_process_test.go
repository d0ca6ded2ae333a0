package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestAgentBusyWorkerJudgedByProgress: long prefills (small preset,
// prompts of about 2,000 tokens, several at once, every step of 512
// positions taking longer than the 1 s canary timeout here) on a node
// whose canaries look every second with a 1 s timeout. The worker
// produces no token while it prefills, but its computed positions
// advance, its canaries are given the step time it reports, and a canary
// slower than that while the worker kept computing is no failure: no
// canary fails, the worker is never restarted, and every request
// completes — prefill-only ones and generating ones.
func TestAgentBusyWorkerJudgedByProgress(t *testing.T) {
	t.Parallel()
	metricsAddr := proctest.FreeTCPAddr(t)
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.Metrics = metricsAddr
		o.CanaryIdle, o.CanaryTimeout = agent.Duration(time.Second), agent.Duration(time.Second)
		o.Instances = []agent.InstanceSpec{{Role: "prefill", Preset: "small", Count: 1}}
		o.ArenaSlots, o.ArenaSlotBytes = 1024, 131072
	})
	const id = "n1-prefill-small-0"
	reg := n.WaitRegistration(t, id, 0)
	c := n.DialWorker(t, id)
	okBefore := canaryCount(scrape(t, metricsAddr), "ok")
	started := time.Now()
	// What the worker reports while it works, for the log: how long its
	// steps take against the 1 s canary timeout.
	var maxStep time.Duration
	watching := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-watching:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if h, err := c.Health(t.Context()); err == nil {
				maxStep = max(maxStep, time.Duration(h.StepTimeUs)*time.Microsecond)
			}
		}
	}()
	var wg sync.WaitGroup
	results := make([]string, 6)
	for i := range results {
		g := &wire.Generate{RequestId: fmt.Sprintf("long-%d", i), PromptTokens: longPrompt(i, 2000), MaxTokens: 8, IgnoreEos: true, Seed: uint64(i)}
		if i < 4 {
			g.PrefillOnly, g.MaxTokens = true, 1
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runToEnd(c, g)
		}()
	}
	wg.Wait()
	close(watching)
	<-watched
	metrics := scrape(t, metricsAddr)
	t.Logf("6 long prompts (4 prefill-only) done in %v; longest step %v; %d canaries passed meanwhile, %d slower than their allowance while the worker progressed",
		time.Since(started), maxStep, canaryCount(metrics, "ok")-okBefore, canaryCount(metrics, "slow_but_progressing"))
	for i, r := range results {
		want := "length"
		if i < 4 {
			want = "prefilled"
		}
		if r != want {
			t.Errorf("request %d ended %q, want %q", i, r, want)
		}
	}
	for _, e := range proctest.JSONLines[controlapi.Event](t, n.Nodectl(t, "events")) {
		if e.Kind == controlapi.EventNotReady || e.Kind == controlapi.EventExit {
			t.Errorf("the busy worker was judged failed: %+v", e)
		}
	}
	w := n.NodectlWorkers(t)[0]
	if w.Restarts != 0 || w.Generation != reg.Generation || !w.Ready {
		t.Fatalf("worker after the long prefills: %+v", w)
	}
	for _, reason := range []string{controlapi.ReasonCanaryTimeout, controlapi.ReasonCanaryError} {
		if strings.Contains(metrics, `lifeline_agent_canary_total{result="`+reason+`"}`) {
			t.Errorf("canary failures counted: %s", reason)
		}
	}
}

// longPrompt is n token ids, different for every i.
func longPrompt(i, n int) []int32 {
	p := make([]int32, n)
	for k := range p {
		p[k] = int32(1 + (k*7+i*13)%250)
	}
	return p
}

// runToEnd runs g and returns its finish reason, or what went wrong.
func runToEnd(c *workerclient.Client, g *wire.Generate) string {
	s, err := c.Generate(context.Background(), g)
	if err != nil {
		return err.Error()
	}
	for {
		f, err := s.Next()
		if err != nil {
			return err.Error()
		}
		if f.FinishReason != "" {
			if f.Error != nil {
				return f.FinishReason + ": " + f.Error.Message
			}
			return f.FinishReason
		}
	}
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// canaryCount is the count of canaries of a result on a metrics page.
func canaryCount(metrics, result string) int {
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, `lifeline_agent_canary_total{result="`+result+`"} `); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}
