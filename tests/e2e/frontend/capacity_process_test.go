package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestFrontendWaitsForRestartedWorkers: every decode worker of the node
// is SIGKILLed at once mid-stream. Nothing can serve the stream until the
// agent has them back; it waits for them instead of failing, and goes on
// bit-identical to a fault-free run.
func TestFrontendWaitsForRestartedWorkers(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.CanaryIdle = agent.Duration(time.Hour)
		o.RestartBackoff = agent.Duration(50 * time.Millisecond)
		o.RestartMax = agent.Duration(100 * time.Millisecond)
		o.CrashLoopLimit = 100
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", StepInterval: agent.Duration(clustertest.PacedStep), Count: 2}}
	})
	ids := []string{"n1-decode-tiny-0", "n1-decode-tiny-1"}
	gens := map[string]uint64{}
	for _, id := range ids {
		gens[id] = n.WaitRegistration(t, id, 0).Generation
	}
	url := startFrontend(t, n.Env)
	body := map[string]any{"model": "tiny", "prompt": "Everyone on the ship fell asleep", "max_tokens": 300,
		"temperature": 0.9, "seed": 17, "stream": true, "ignore_eos": true}
	want, _ := clustertest.StreamCompletion(t, url, body, nil)
	var killed time.Time
	got, last := clustertest.StreamCompletion(t, url, body, func(tok clustertest.Token) {
		if tok.Seq != 30 || !killed.IsZero() {
			return
		}
		ws, err := n.Workers(context.Background())
		if err != nil || len(ws) != 2 {
			t.Errorf("workers: %v %v", ws, err)
			return
		}
		killed = time.Now()
		for _, w := range ws {
			syscall.Kill(w.PID, syscall.SIGKILL)
		}
	})
	if killed.IsZero() {
		t.Fatal("never killed the workers")
	}
	sameTokens(t, "the stream", got, want)
	for _, id := range ids {
		if r := n.WaitRegistration(t, id, gens[id]); r.Generation <= gens[id] {
			t.Fatalf("%s at generation %d", id, r.Generation)
		}
	}
	m := clustertest.Metrics(t, url)
	if !strings.Contains(m, `lifeline_frontend_capacity_waits_total{result="served"}`) {
		log := n.Log.String()
		t.Fatalf("the stream never waited for capacity (workers killed at %s):\n%s\nthe agent's log, its end:\n%s", killed.Format("15:04:05.000"), m, log[max(0, len(log)-6000):])
	}
	ll, _ := last["lifeline"].(map[string]any)
	t.Logf("both workers killed at sequence 30; the stream waited for their restart and continued bit-identical (%v migrations)", ll["migrations"])
}

// TestFrontendWaitsForCapacity: a request made while no instance is
// registered yet (the cluster is starting) waits and is served once one
// registers; /readyz says 503 (no routable instance; the quiet registry
// is healthy) until then, and /healthz 200 throughout.
// Past the wait's bound a request for a model whose instances are gone
// gets a retryable 503 no_capacity with Retry-After, whole or streamed,
// never a 404; a model nobody ever served is a 404 at once. With etcd
// gone, /readyz says the registry watch is not healthy.
func TestFrontendWaitsForCapacity(t *testing.T) {
	t.Parallel() // waits on timers and processes: overlapped with the other waiting tests
	env := clustertest.NewEnv(t)
	url := startFrontend(t, env)
	short := startFrontend(t, env, "--capacity-wait", "1s")
	for _, u := range []string{url, short} {
		if code, _ := getJSON(u + "/healthz"); code != http.StatusOK {
			t.Fatalf("/healthz %d", code)
		}
		if code, body := getJSON(u + "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no routable instance") {
			t.Fatalf("/readyz with no instance: %d %s", code, body)
		}
	}
	// The cluster is starting: even the short wait answers 503, not 404.
	refused := post(t, short, `{"model":"tiny","prompt":"too early","max_tokens":4}`)
	if refused.code != http.StatusServiceUnavailable || refused.retryAfter == "" || !strings.Contains(refused.body, `"type":"no_capacity"`) || refused.took < time.Second {
		t.Fatalf("past the bound while starting: %+v", refused)
	}
	early := make(chan answer, 2)
	go func() {
		early <- postAsync(url, `{"model":"tiny","prompt":"Once upon a time","max_tokens":6,"seed":5,"ignore_eos":true}`)
	}()
	streamed := streamAsync(url, map[string]any{"model": "tiny", "prompt": "Far away", "max_tokens": 6, "seed": 6, "stream": true, "ignore_eos": true}, nil)
	// Longer than watchStale: a quiet registry is still a healthy one.
	proctest.Never(t, 6*time.Second, "a request answered while no instance is registered", func() (bool, string) {
		select {
		case a := <-early:
			return true, fmt.Sprintf("%+v", a)
		default:
			return false, ""
		}
	})
	if code, body := getJSON(url + "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no routable instance") {
		t.Fatalf("/readyz of a quiet registry with no instance: %d %s", code, body)
	}
	n := clustertest.StartNode(t, env, "n1", func(o *clustertest.Config) { o.CanaryIdle = agent.Duration(time.Hour) })
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	if a := <-early; a.code != http.StatusOK || !strings.Contains(a.body, `"text_completion"`) {
		t.Fatalf("the waiting request: %+v", a)
	}
	if s := <-streamed; s.status != http.StatusOK || !s.done || len(s.toks) != 6 {
		t.Fatalf("the waiting stream: %+v", s)
	}
	if !strings.Contains(clustertest.Metrics(t, url), `lifeline_frontend_capacity_waits_total{result="served"} 2`) {
		t.Fatal("the waits are not counted")
	}
	for _, u := range []string{url, short} {
		proctest.WaitFor(t, 5*time.Second, "/readyz to say ready", func() (bool, string) {
			code, body := getJSON(u + "/readyz")
			return code == http.StatusOK, fmt.Sprint(code, body)
		})
	}

	// The node goes away: the model is known, but nothing serves it.
	n.Stop(10 * time.Second)
	proctest.WaitFor(t, 10*time.Second, "the registration to vanish", func() (bool, string) {
		code, body := getJSON(short + "/readyz")
		return code == http.StatusServiceUnavailable, fmt.Sprint(code, body)
	})
	whole := post(t, short, `{"model":"tiny","prompt":"anyone there?","max_tokens":4}`)
	if whole.code != http.StatusServiceUnavailable || whole.retryAfter == "" || !strings.Contains(whole.body, `"type":"no_capacity"`) ||
		whole.took < time.Second || whole.took > 10*time.Second {
		t.Fatalf("past the bound: %+v", whole)
	}
	s := <-streamAsync(short, map[string]any{"model": "tiny", "prompt": "anyone?", "max_tokens": 4, "stream": true}, nil)
	if s.status != http.StatusServiceUnavailable || s.retryAfter == "" || !strings.Contains(s.body, `"type":"no_capacity"`) {
		t.Fatalf("streamed past the bound: %+v", s)
	}
	if unknown := post(t, short, `{"model":"nonexistent","prompt":"hi"}`); unknown.code != http.StatusNotFound || unknown.took > time.Second {
		t.Fatalf("a model nobody served: %+v", unknown)
	}

	env.Etcd.Close()
	proctest.WaitFor(t, 20*time.Second, "/readyz to report the registry watch", func() (bool, string) {
		code, body := getJSON(url + "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "registry watch"), fmt.Sprint(code, body)
	})
	if code, _ := getJSON(url + "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d with etcd gone", code)
	}
}

// answer is a whole response.
type answer struct {
	code       int
	body       string
	retryAfter string
	took       time.Duration
}

func postAsync(url, body string) answer {
	start := time.Now()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return answer{body: err.Error()}
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return answer{code: resp.StatusCode, body: b.String(), retryAfter: resp.Header.Get("Retry-After"), took: time.Since(start)}
}

func post(t *testing.T, url, body string) answer {
	t.Helper()
	a := postAsync(url, body)
	if a.code == 0 {
		t.Fatalf("POST: %s", a.body)
	}
	return a
}
