package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// trickle sends short requests to the frontends in turn until stopped,
// and records the failures.
type trickle struct {
	stop   chan struct{}
	done   sync.WaitGroup
	mu     sync.Mutex
	sent   int
	failed []string
}

func startTrickle(urls []string) *trickle {
	tr := &trickle{stop: make(chan struct{})}
	body := map[string]any{"model": "tiny", "prompt": "A short note", "max_tokens": 4, "stream": true, "ignore_eos": true}
	tr.done.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-tr.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			got, last, err := clustertest.Stream(urls[i%len(urls)], body, nil)
			tr.mu.Lock()
			tr.sent++
			if err != nil || len(got) != 4 {
				tr.failed = append(tr.failed, fmt.Sprintf("%d tokens, %v, last %v", len(got), err, last))
			}
			tr.mu.Unlock()
		}
	})
	return tr
}

func (tr *trickle) finish() (sent int, failed []string) {
	close(tr.stop)
	tr.done.Wait()
	return tr.sent, tr.failed
}

// TestAgentDrainWaitsForFrontendAcks: two frontends and two nodes, a
// steady trickle of short requests through both, and a long stream
// through the first. `nodectl drain --deadline 1s` of the node serving
// the stream (drain_settle 10 s, so the bound is the deadline): both
// frontends acknowledge the draining registrations well before the bound,
// no request is started on the drained node after the acknowledgement,
// none of the trickle fails, and the stream the deadline ends migrates,
// counted by the first frontend as a drain migration.
func TestAgentDrainWaitsForFrontendAcks(t *testing.T) {
	t.Parallel()
	c := newDrainCluster(t, func(o *clustertest.Config) { o.DrainSettle = agent.Duration(10 * time.Second) })
	n1 := c.nodes["n1-decode-tiny-0"]
	url2 := clustertest.StartFrontend(t, n1)
	proctest.WaitFor(t, 10*time.Second, "two frontends registered", func() (bool, string) {
		resp, err := n1.Env.Client.Get(t.Context(), schema.FrontendsPrefix, clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 2, fmt.Sprint(resp, err)
	})
	tr := startTrickle([]string{c.url, url2})
	var (
		node     *clustertest.Node
		drainOut []byte
		drainErr error
		drained  = make(chan struct{})
	)
	served, _ := c.streamDisturbed(t, func(instance string) {
		defer close(drained)
		node = c.nodes[instance]
		drainOut, drainErr = exec.Command(proctest.Nodectl(t), "--socket", node.Options.Socket, "drain", "--deadline", "1s", "--hard-deadline", "30s").CombinedOutput()
	})
	<-drained
	sent, failed := tr.finish()
	if drainErr != nil {
		t.Fatalf("nodectl drain: %v\n%s", drainErr, drainOut)
	}
	t.Logf("nodectl drain:\n%s", drainOut)
	if len(failed) > 0 {
		t.Fatalf("%d of %d trickle requests failed: %v", len(failed), sent, failed)
	}
	d := node.NodectlStatus(t).Drain
	bound := d.Deadline.Sub(d.StartedAt)
	t.Logf("%d trickle requests; %d/%d frontends acknowledged (all: %v) in %v (bound %v); %d routed after", sent, d.FrontendsAcked, d.Frontends,
		d.AllAcked, d.AckWait, bound, d.RoutedAfterNotReady)
	if d.Frontends != 2 || d.FrontendsAcked != 2 || !d.AllAcked || d.AckWait <= 0 || d.AckWait >= bound/2 {
		t.Fatalf("acknowledgement: %d/%d (all: %v) in %v, want 2/2 well within the bound %v", d.FrontendsAcked, d.Frontends, d.AllAcked, d.AckWait, bound)
	}
	if d.RoutedAfterNotReady != 0 || d.ForcedEnded != 1 {
		t.Fatalf("drain: %d requests routed here after the acknowledgement (want 0), %d ended by the deadline (want 1)", d.RoutedAfterNotReady, d.ForcedEnded)
	}
	if out := node.Nodectl(t, "status"); !strings.Contains(out, "2/2 frontends acknowledged (all: true)") {
		t.Fatalf("nodectl status does not show the acknowledgement:\n%s", out)
	}
	if out := node.Nodectl(t, "events"); !strings.Contains(out, "2/2 frontends acknowledged in") {
		t.Fatalf("no drain event of the acknowledgement:\n%s", out)
	}
	if m := scrape(t, c.metrics[served]); !strings.Contains(m, "lifeline_agent_drain_routed_after_not_ready_total 0") {
		t.Errorf("metrics of the drained node: %s", grepLines(m, "routed_after"))
	}
	for i, url := range []string{c.url, url2} {
		m := clustertest.Metrics(t, url)
		if !strings.Contains(m, "lifeline_frontend_routed_to_not_ready_total 0") {
			t.Errorf("frontend %d routed to a not-ready instance", i+1)
		}
		if i == 0 && strings.Contains(m, "lifeline_frontend_drain_migrations_total 0") {
			t.Errorf("frontend 1: the stream the drain ended did not count as a drain migration")
		}
		t.Logf("frontend %d: %s", i+1, grepLines(m, "drain_migrations", "not_ready"))
	}
}

func grepLines(s string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "; ")
}
