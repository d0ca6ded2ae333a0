package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/internal/debugsock"
	"github.com/lifeline-llm/lifeline/internal/embedetcd"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/internal/tracing"
	"github.com/lifeline-llm/lifeline/tests/cgtest"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestAgentDetectsWorkerKill: SIGKILL a worker. The agent's eBPF detector
// (as root) sees it, the registration is gone and a failure is announced in
// etcd without waiting for any lease, and the instance comes back at the
// next generation once a canary passed.
func TestAgentDetectsWorkerKill(t *testing.T) {
	t.Parallel()
	metricsAddr := proctest.FreeTCPAddr(t)
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.Metrics = metricsAddr
		o.Instances = clustertest.Instances("decode", 1)
		o.Instances[0].Threads = 1
	})
	const id = "n1-decode-tiny-0"
	reg := n.WaitRegistration(t, id, 0)
	ws := n.NodectlWorkers(t)
	if len(ws) != 1 || ws[0].PID == 0 || ws[0].Generation != reg.Generation || !ws[0].Ready {
		t.Fatalf("workers: %+v", ws)
	}
	// threads: 1 reaches the worker as its GOMAXPROCS.
	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", ws[0].PID)); err != nil || !slices.Contains(strings.Split(string(env), "\x00"), "GOMAXPROCS=1") {
		t.Fatalf("worker environment lacks GOMAXPROCS=1 (%v)", err)
	}
	watch := n.Env.Client.Watch(context.Background(), schema.InstancesPrefix+id)
	failures := n.Env.Client.Watch(context.Background(), schema.FailuresPrefix+id)

	killed := time.Now()
	if err := syscall.Kill(ws[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var deleted, announced time.Time
	for deleted.IsZero() || announced.IsZero() {
		select {
		case wr := <-watch:
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete && deleted.IsZero() {
					deleted = time.Now()
				}
			}
		case fr := <-failures:
			for _, ev := range fr.Events {
				if ev.Type == clientv3.EventTypePut && announced.IsZero() {
					announced = time.Now()
					var f schema.Failure
					json.Unmarshal(ev.Kv.Value, &f)
					if f.Generation != reg.Generation || f.Reason != controlapi.ReasonSignal {
						t.Fatalf("failure %+v", f)
					}
					if os.Geteuid() == 0 && f.Detector != "ebpf" {
						t.Fatalf("running as root but the death was detected by %q", f.Detector)
					}
				}
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no deregistration/announcement within 10s; agent log:\n%s", n.Log.String())
		}
	}
	// Kill → agent event (kernel time of the exit tracepoint).
	var exitEvent controlapi.Event
	for _, line := range strings.Split(strings.TrimSpace(n.Nodectl(t, "events")), "\n") {
		var e controlapi.Event
		json.Unmarshal([]byte(line), &e)
		if e.Kind == controlapi.EventExit && e.InstanceID == id {
			exitEvent = e
		}
	}
	if exitEvent.Signal != 9 || exitEvent.Generation != reg.Generation {
		t.Fatalf("exit event %+v", exitEvent)
	}
	t.Logf("kill → detected %v (%s), → key deleted %v, → failure announced %v",
		exitEvent.DetectedAt.Sub(killed), exitEvent.Detector, deleted.Sub(killed), announced.Sub(killed))
	if d := deleted.Sub(killed); d > 2*time.Second {
		t.Fatalf("deregistration took %v: that is lease-expiry speed, not detection", d)
	}
	next := n.WaitRegistration(t, id, reg.Generation)
	if next.Generation != reg.Generation+1 {
		t.Fatalf("back at generation %d, want %d", next.Generation, reg.Generation+1)
	}
	ws = n.NodectlWorkers(t)
	if ws[0].LastExit == nil || ws[0].LastExit.Reason != controlapi.ReasonSignal || ws[0].Restarts != 1 || ws[0].Generation != next.Generation {
		t.Fatalf("workers after restart: %+v", ws[0])
	}
	checkDeathTrace(t, debugsock.Base(n.Options.Socket), id, reg.Generation, killed)
	// The debug pages are on the control socket alone, never on the
	// metrics port every local user reaches.
	for _, page := range []string{"/debug/traces", "/debug/pprof/goroutine?debug=1", "/debug/pprof/heap"} {
		resp, err := http.Get("http://" + metricsAddr + page)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("the metrics port serves %s: %s", page, resp.Status)
		}
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`lifeline_agent_worker_exits_total{reason="signal"} 1`, `lifeline_agent_restarts_total{instance_id="n1-decode-tiny-0"} 1`,
		`lifeline_agent_failure_detection_seconds_count{detector="` + exitEvent.Detector + `"} 1`, `lifeline_agent_canary_total{result="ok"}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// A clean stop takes the workers and the registrations with it.
	n.Process().Signal(syscall.SIGTERM)
	<-n.Exited()
	if err := syscall.Kill(ws[0].PID, 0); err == nil {
		t.Fatal("worker survived the agent's clean stop")
	}
	if resp, err := n.Env.Client.Get(context.Background(), schema.InstancesPrefix, clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("registrations left after a clean stop: %v %v", resp, err)
	}
}

// checkDeathTrace: the agent traced the death of id at gen (from the
// kernel's exit time, after the kill: exit, detected, KV reclaimed,
// deregistered, failure announced, in order) and both starts of the
// instance (generation, process, ready), the second at gen+1.
func checkDeathTrace(t *testing.T, debug, id string, gen uint64, killed time.Time) {
	t.Helper()
	spans, err := tracing.Fetch(context.Background(), debug, "instance_id", id)
	if err != nil {
		t.Fatal(err)
	}
	var deaths, starts []tracing.Span
	for _, s := range spans {
		switch s.Name {
		case "lifeline.worker_death":
			deaths = append(deaths, s)
		case "lifeline.worker_start":
			starts = append(starts, s)
		}
	}
	if len(deaths) != 1 || len(starts) != 2 {
		t.Fatalf("%d death spans, %d start spans: %+v", len(deaths), len(starts), spans)
	}
	d := deaths[0]
	var steps []string
	for i, e := range d.Events {
		steps = append(steps, e.Name)
		if i > 0 && e.At.Before(d.Events[i-1].At) {
			t.Errorf("death event %s before %s", e.Name, d.Events[i-1].Name)
		}
	}
	if got := strings.Join(steps, " "); got != "exit detected kv_reclaimed deregistered failure_announced" ||
		d.Attrs["generation"] != fmt.Sprint(gen) || d.Attrs["failure_reason"] != controlapi.ReasonSignal || d.Start.Before(killed.Add(-time.Second)) {
		t.Errorf("death span %+v (steps %s)", d, got)
	}
	for i, s := range starts {
		var names []string
		for _, e := range s.Events {
			names = append(names, e.Name)
		}
		if strings.Join(names, " ") != "generation process_started ready" || s.Attrs["generation"] != fmt.Sprint(gen+uint64(i)) || s.Error != "" {
			t.Errorf("start span %d: %+v", i, s)
		}
	}
	t.Logf("death traced: exit → announced %v; restart %v", d.End.Sub(d.Start).Round(time.Microsecond), starts[1].End.Sub(starts[1].Start).Round(time.Millisecond))
}

func TestAgentBadConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct {
		cfg  string
		want string
	}{
		{`{"node_id": "", "data_dir": "d"}`, "node_id"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "lease_ttl": "100ms"}`, "lease_ttl"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "instances": [{"role": "chef", "preset": "tiny", "count": 1}]}`, "instances[0].role"},
		{`{"node_id": "a", "typo_field": 1}`, "typo_field"},
		{`{"node_id": `, "agent.json"},
		{`{"node_id": "a", "lease_ttl": 3}`, "duration"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "restart_backoff": "-1s"}`, "restart_backoff"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "canary_idle": "-5s"}`, "canary_idle"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "crash_loop_cooldown": "-1s"}`, "crash_loop_cooldown"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "crash_loop_cooldown": "1m", "crash_loop_cooldown_max": "30s"}`, "crash_loop_cooldown_max"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "drain_deadline": "40s", "drain_hard_deadline": "30s"}`, "drain_hard_deadline"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "drain_deadline": "-1s"}`, "drain_deadline"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "lease_ttl": "2500ms"}`, "lease_ttl"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "instances": [{"role": "decode", "preset": "tiny", "count": 1}, {"role": "decode", "preset": "tiny", "count": 2}]}`, "instances[1]"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "worker_cgroup": "/nonexistent/cg"}`, "worker_cgroup"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "instances": [{"role": "decode", "preset": "small", "count": 1, "draft_preset": "huge"}]}`, "instances[0].draft_preset"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "instances": [{"role": "decode", "preset": "small", "count": 1, "draft_layers": 2, "draft_k": 17}]}`, "instances[0].draft_layers"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "transfer_listen": "0.0.0.0:7480"}`, "transfer_advertise"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "transfer_listen": "nonsense"}`, "transfer_listen"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "instances": [{"role": "decode", "preset": "tiny", "count": 1, "threads": -1}]}`, "instances[0].threads"},
		// 6 query heads do not split 4 ways; tp 9 is past the most ranks.
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "instances": [{"role": "decode", "preset": "small", "count": 1, "tp": 4}]}`, "instances[0].tp"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "instances": [{"role": "decode", "preset": "tiny", "count": 1, "tp": 9}]}`, "instances[0].tp"},
	} {
		p := filepath.Join(dir, "agent.json")
		os.WriteFile(p, []byte(c.cfg), 0o600)
		_, errOut, err := proctest.Run(t, "agent", "--config", p, "--check-config")
		if err == nil || !strings.Contains(errOut, c.want) || strings.Contains(errOut, "panic") {
			t.Errorf("%s: err %v, stderr %q (want it to name %q)", c.cfg, err, errOut, c.want)
		}
	}
	// --check-config checks the certificate directory too: it used to
	// say OK with none.
	ca := clustertest.CADir(t)
	mine, theirs := clustertest.Issue(t, ca, "agent", "a"), clustertest.Issue(t, ca, "agent", "b")
	for certs, want := range map[string]string{filepath.Join(dir, "none"): "issue them: lifeline certs issue --role agent --name a", theirs: "are agent:b's, not agent:a's"} {
		cfg := fmt.Sprintf(`{"node_id": "a", "data_dir": %q, "socket": "s", "etcd": ["127.0.0.1:1"], "certs": %q, "arena": "/dev/shm/x"}`, dir, certs)
		p := filepath.Join(dir, "certs.json")
		os.WriteFile(p, []byte(cfg), 0o600)
		if _, errOut, err := proctest.Run(t, "agent", "--config", p, "--check-config"); err == nil || !strings.Contains(errOut, want) {
			t.Errorf("certs %s: err %v, stderr %q (want %q)", certs, err, errOut, want)
		}
	}
	good := fmt.Sprintf(`{"node_id": "a", "data_dir": %q, "socket": "s", "etcd": ["127.0.0.1:1"], "certs": %q, "arena": "/dev/shm/x"}`, dir, mine)
	p := filepath.Join(dir, "good.json")
	os.WriteFile(p, []byte(good), 0o600)
	if out, errOut, err := proctest.Run(t, "agent", "--config", p, "--check-config"); err != nil || !strings.Contains(out, "config OK") {
		t.Fatalf("good config: %v %s %s", err, out, errOut)
	}
}

// TestAgentRestartAdoptsWorkers: the agent is SIGKILLed while a stream is
// in flight. The worker keeps running and keeps streaming; the restarted
// agent adopts it at the same pid and generation instead of restarting
// it, and still detects its death afterwards.
func TestAgentRestartAdoptsWorkers(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t)
	const id = "n1-decode-tiny-0"
	reg := n.WaitRegistration(t, id, 0)
	before := n.NodectlWorkers(t)[0]

	tlsConf, err := workerclient.ClientTLS(n.Env.Certs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := workerclient.Dial(ctx, reg.Addr, tlsConf, id, reg.Generation)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Generate(ctx, &wire.Generate{RequestId: "long", Prompt: "Once upon a time", MaxTokens: 480, IgnoreEos: true, Seed: 1, Temperature: 0.8})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	n.Process().Kill()
	<-n.Exited()
	n.Restart(t)
	frames := clustertest.CollectFrames(t, s)
	if last := frames[len(frames)-1]; last.FinishReason != "length" || len(frames) != 480 {
		t.Fatalf("stream across the agent restart: %d frames, last %+v", len(frames), last)
	}
	after := n.WaitWorkerReady(t)
	again := n.WaitRegistration(t, id, 0)
	if after.PID != before.PID || after.Generation != before.Generation || again.Generation != reg.Generation {
		t.Fatalf("restarted agent did not adopt: before %+v, after %+v", before, after)
	}
	if err := syscall.Kill(after.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	next := n.WaitRegistration(t, id, reg.Generation)
	if next.Generation != reg.Generation+1 {
		t.Fatalf("after the adopted worker died: generation %d", next.Generation)
	}
}

// TestAgentCanaryCatchesStoppedWorker: a SIGSTOPped worker still has its
// process and its socket, but its canary times out: the instance goes not
// ready within the canary window and is restarted (at generation + 1) after
// the failure threshold.
func TestAgentCanaryCatchesStoppedWorker(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.CanaryIdle, o.CanaryTimeout, o.CanaryFailures = agent.Duration(300*time.Millisecond), agent.Duration(300*time.Millisecond), 2
	})
	const id = "n1-decode-tiny-0"
	reg := n.WaitRegistration(t, id, 0)
	w := n.NodectlWorkers(t)[0]
	stopped := time.Now()
	if err := syscall.Kill(w.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(w.PID, syscall.SIGCONT)
	// Not ready (deregistered) within a few canary windows.
	proctest.WaitFor(t, 10*time.Second, "the stopped worker to be deregistered", func() (bool, string) {
		resp, err := n.Env.Client.Get(context.Background(), schema.InstancesPrefix+id)
		return err == nil && len(resp.Kvs) == 0, "log:\n" + n.Log.String()
	})
	t.Logf("SIGSTOP → not ready after %v", time.Since(stopped))
	next := n.WaitRegistration(t, id, reg.Generation)
	ws := n.NodectlWorkers(t)
	if next.Generation != reg.Generation+1 || ws[0].LastExit == nil || ws[0].LastExit.Reason != controlapi.ReasonCanaryTimeout {
		t.Fatalf("after the canary threshold: generation %d, last exit %+v", next.Generation, ws[0].LastExit)
	}
}

func TestAgentControlSocketBadRequests(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t)
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", n.Options.Socket)
	}}}
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/v1/nope", 404},
		{"POST", "/v1/status", 404},
		{"DELETE", "/v1/workers", 404},
		{"GET", "/v1/events?follow=maybe", 400},
		{"POST", "/v1/drain", 400},
		{"POST", "/v1/undrain", 409},
		{"POST", "/v1/instances/nope/reset", 404},
		{"POST", "/v1/instances/n1-decode-tiny-0/reset", 409},
		{"GET", "/v1/status", 200},
	} {
		req, _ := http.NewRequest(c.method, "http://agent"+c.path, strings.NewReader("{garbage"))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.want)
		}
	}
	// Raw garbage on the socket.
	conn, err := net.Dial("unix", n.Options.Socket)
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("\x00\xff not http at all\r\n\r\n"))
	conn.Close()
	if st, err := os.Stat(n.Options.Socket); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("control socket mode: %v %v", st, err)
	}
	// Still serving.
	if out := n.Nodectl(t, "status"); !strings.Contains(out, "failure detector") || !strings.Contains(out, "GPU:") {
		t.Fatalf("status after abuse: %s", out)
	}
	// The canary's sequence wrote and published arena blocks? It is short
	// (under one block), so the arena may be empty; kv ls must answer
	// either way, as a JSON array.
	var slots []map[string]any
	if err := json.Unmarshal([]byte(n.Nodectl(t, "kv", "ls", "--json")), &slots); err != nil {
		t.Fatalf("kv ls --json: %v", err)
	}
	if out := n.Nodectl(t, "kv", "stats"); !strings.Contains(out, "Slots") {
		t.Fatalf("kv stats: %s", out)
	}
}

// TestAgentEtcdOutage: etcd goes away for longer than the lease TTL. An
// in-flight generation completes; once the TTL has passed the node says it
// is not routable and its worker refuses new requests (typed, retryable);
// when etcd is back on its data the instance serves again by the same
// process: at its generation when etcd still held the lease (it extends
// every lease as it becomes leader), at a higher one when it had dropped
// it.
func TestAgentEtcdOutage(t *testing.T) {
	t.Parallel() // mostly waits out etcd outages and dial timeouts
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.LeaseTTL, o.CanaryIdle = agent.Duration(2*time.Second), agent.Duration(time.Hour)
	})
	const id = "n1-decode-tiny-0"
	reg := n.WaitRegistration(t, id, 0)
	pid := n.NodectlWorkers(t)[0].PID
	tlsConf, _ := workerclient.ClientTLS(n.Env.Certs)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := workerclient.Dial(ctx, reg.Addr, tlsConf, id, reg.Generation)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A slow stream: it runs through the outage.
	s, err := c.Generate(ctx, &wire.Generate{RequestId: "inflight", Prompt: "Once upon a time", MaxTokens: 400, IgnoreEos: true, Lane: wire.Lane_BATCH})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	etcdDir, port := n.Env.Etcd.Dir(), n.Env.Etcd.Port()
	n.Env.Etcd.Close()
	down := time.Now()
	// Not routable after the TTL.
	var st controlapi.Status
	proctest.WaitFor(t, 20*time.Second, "the node to say it is not routable during the etcd outage", func() (bool, string) {
		st = n.NodectlStatus(t)
		return !st.Etcd.Routable, fmt.Sprintf("%+v", st.Etcd)
	})
	if st.Etcd.LastRenewalMs < 2000 {
		t.Fatalf("not routable %dms after its last renewal, before the 2s TTL", st.Etcd.LastRenewalMs)
	}
	t.Logf("not routable %v after etcd stopped (%dms after the last renewal)", time.Since(down), st.Etcd.LastRenewalMs)
	// New work is refused once the agent has fenced the worker.
	proctest.WaitFor(t, 10*time.Second, "a new request to be refused (typed, retryable) during the outage", func() (bool, string) {
		ns, err := c.Generate(ctx, &wire.Generate{RequestId: "new", Prompt: "hi", MaxTokens: 3, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		fs := clustertest.CollectFrames(t, ns)
		return len(fs) == 1 && fs[0].Error.GetCode() == wire.Code_FENCED && fs[0].Error.GetRetryable(), fmt.Sprintf("%+v", fs)
	})
	// The in-flight stream is not cut.
	frames := clustertest.CollectFrames(t, s)
	if last := frames[len(frames)-1]; last.FinishReason != "length" {
		t.Fatalf("in-flight stream ended %+v", last)
	}
	// etcd returns on its data. As it becomes leader it extends every
	// lease by an election timeout: a lease that was live when etcd
	// stopped is kept, and the same process serves again at the same
	// generation (lease_kept). On a loaded machine the agent's renewals
	// may already have lapsed before the stop (seen: 4.2 s after the last
	// renewal, with a 2 s TTL): etcd dropped that lease, and the instance
	// comes back at a higher generation (reregistered). Either way the
	// generation says which happened, and the same process serves.
	e2, err := embedetcd.Start(etcdDir, port, n.Env.Etcd.CertDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e2.Close)
	var kept, rereg bool
	proctest.WaitFor(t, 20*time.Second, "the agent to keep its lease or take a new one after etcd came back", func() (bool, string) {
		evs, err := n.Events(ctx)
		kinds := []string{}
		kept, rereg = false, false
		for _, e := range evs {
			kinds = append(kinds, e.Kind)
			if e.Time.After(down) {
				kept = kept || e.Kind == controlapi.EventLeaseKept
				rereg = rereg || e.Kind == controlapi.EventReregistered
			}
		}
		return err == nil && (kept || rereg) && n.NodectlStatus(t).Etcd.Routable, fmt.Sprint(kinds, err)
	})
	next := n.WaitRegistration(t, id, 0)
	if w := n.NodectlWorkers(t)[0]; w.PID != pid || kept == rereg || kept != (next.Generation == reg.Generation) {
		t.Fatalf("after the outage: pid %d (was %d), generation %d (was %d), lease kept %v, re-registered %v", w.PID, pid, next.Generation, reg.Generation, kept, rereg)
	}
	t.Logf("after the outage: lease kept %v, generation %d (was %d)", kept, next.Generation, reg.Generation)
	proctest.WaitFor(t, 10*time.Second, "the worker to accept new requests again", func() (bool, string) {
		ns, err := c.Generate(ctx, &wire.Generate{RequestId: "after", Prompt: "hi", MaxTokens: 3, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		fs := clustertest.CollectFrames(t, ns)
		return len(fs) == 4 && fs[0].Generation == next.Generation, fmt.Sprintf("%+v", fs)
	})
}

// TestSystemdUnitVerifies runs systemd's own checker over the units (the
// agent's, the frontend's, an etcd member's), pointed
// at the binary under test. CI (.ci/run sets LIFELINE_CI and installs
// systemd when it is missing) never skips it; a developer machine without
// systemd-analyze does.
func TestSystemdUnitVerifies(t *testing.T) {
	t.Parallel()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("LIFELINE_CI") != "" {
			t.Fatal("systemd-analyze is missing in CI: the unit is not verified")
		}
		t.Skip("systemd-analyze is not installed on this machine")
	}
	units, _ := filepath.Glob("../../../deploy/*.service")
	if len(units) < 3 {
		t.Fatalf("units %v: want the agent's, the frontend's and etcd's", units)
	}
	for _, u := range units {
		unit, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), filepath.Base(u))
		os.WriteFile(p, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/lifeline", proctest.Lifeline(t))), 0o644)
		if out, err := exec.Command(analyze, "verify", p).CombinedOutput(); err != nil {
			t.Fatalf("systemd-analyze verify %s: %v\n%s", filepath.Base(u), err, out)
		}
	}
}

// TestAgentStaleDeathsNeverOrphanAWorker: a worker that crashes at start a
// few times in a row (both the detector and the reaper report each death)
// must leave exactly one supervised worker running, never a second one
// whose death report was mistaken for an older process's.
func TestAgentStaleDeathsNeverOrphanAWorker(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	script := filepath.Join(dir, "flaky-worker")
	counter := filepath.Join(dir, "starts")
	os.WriteFile(script, []byte(fmt.Sprintf("#!/bin/sh\nn=$(cat %s 2>/dev/null || echo 0)\necho $((n+1)) > %s\n[ $n -lt 5 ] && exit 1\nexec %s \"$@\"\n", counter, counter, proctest.Lifeline(t))), 0o755)
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.WorkerBinary, o.CrashLoopLimit = script, 20
		o.RestartBackoff, o.RestartMax = agent.Duration(10*time.Millisecond), agent.Duration(20*time.Millisecond)
	})
	const id = "n1-decode-tiny-0"
	n.WaitRegistration(t, id, 0)
	kvSock := filepath.Join(n.Dir, "data", "kv.sock")
	w := n.WaitWorkerReady(t)
	// A stray death report would be (mis)used within moments: watch the
	// process table for a while.
	proctest.Never(t, 300*time.Millisecond, "a second or unsupervised worker process", func() (bool, string) {
		pids := proctest.WorkerPIDs(kvSock)
		return len(pids) != 1 || pids[0] != w.PID, fmt.Sprintf("worker processes %v, supervised %d", pids, w.PID)
	})
	if again := n.NodectlWorkers(t)[0]; again.PID != w.PID || !again.Ready {
		t.Fatalf("supervised worker changed: %+v", again)
	}
}

// TestAgentWorkerDeathDuringEtcdOutage: with etcd down a dead worker cannot
// get a new generation; the agent waits for etcd instead of counting it as
// a crash loop, and the instance comes back when etcd does.
func TestAgentWorkerDeathDuringEtcdOutage(t *testing.T) {
	t.Parallel() // mostly waits out etcd outages and dial timeouts
	n := clustertest.NewNode(t, func(o *clustertest.Config) { o.LeaseTTL, o.CrashLoopLimit = agent.Duration(2*time.Second), 2 })
	const id = "n1-decode-tiny-0"
	reg := n.WaitRegistration(t, id, 0)
	pid := n.NodectlWorkers(t)[0].PID
	etcdDir, port := n.Env.Etcd.Dir(), n.Env.Etcd.Port()
	n.Env.Etcd.Close()
	syscall.Kill(pid, syscall.SIGKILL)
	// The agent waits for etcd to give the restart a generation...
	proctest.WaitFor(t, 10*time.Second, "the instance to wait for etcd", func() (bool, string) {
		w := n.NodectlWorkers(t)[0]
		if w.State == "crash_loop" {
			t.Fatalf("etcd outage counted as a crash loop: %+v", w)
		}
		return w.State == "waiting_for_etcd", fmt.Sprintf("%+v", w)
	})
	// ...and keeps waiting, well past what the crash-loop limit (2 exits,
	// 100 ms backoff) would allow, without counting crashes.
	proctest.Never(t, 3*time.Second, "the etcd outage counted as a crash loop", func() (bool, string) {
		w := n.NodectlWorkers(t)[0]
		return w.State == "crash_loop", fmt.Sprintf("%+v", w)
	})
	e2, err := embedetcd.Start(etcdDir, port, n.Env.Etcd.CertDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e2.Close)
	next := n.WaitRegistration(t, id, reg.Generation)
	if w := n.NodectlWorkers(t)[0]; w.PID == pid || w.PID == 0 {
		t.Fatalf("instance not restarted after etcd returned: %+v (generation %d)", w, next.Generation)
	}
}

// TestAgentClassifiesOOMKill: the agent places its workers in a memory
// cgroup limited to 256 MiB (worker_cgroup); the worker makes a controlled
// 512 MiB allocation (failpoint) once it serves. The OOM killer takes it,
// never the agent (which stays outside the cgroup), and the agent records
// the death as an OOM kill, not as a signal 9.
func TestAgentClassifiesOOMKill(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("not root: cannot create a memory cgroup")
	}
	dir := cgtest.Memory(t, 256<<20)
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.ExtraEnv = []string{"LIFELINE_FAILPOINTS=worker.after-ready=allocMB:512"}
		o.CrashLoopLimit, o.WorkerCgroup = 1, dir
		o.RestartBackoff, o.RestartMax = agent.Duration(5*time.Second), agent.Duration(5*time.Second)
		// A canary timing out while the worker fills its cgroup (reclaim
		// is slow on a loaded machine) would have the agent kill it first
		// (seen: reason canary_timeout): canaries out of the way.
		o.CanaryIdle = agent.Duration(time.Hour)
	})
	proctest.WaitFor(t, 30*time.Second, "the OOM kill's exit event", func() (bool, string) {
		for _, line := range strings.Split(strings.TrimSpace(n.NodectlTry(t, "events")), "\n") {
			var e controlapi.Event
			if json.Unmarshal([]byte(line), &e) == nil && e.Kind == controlapi.EventExit {
				if e.Reason != controlapi.ReasonOOM || e.Signal != 9 || e.Detector != "ebpf" {
					t.Fatalf("OOM kill recorded as %+v", e)
				}
				return true, ""
			}
		}
		return false, "agent log:\n" + n.Log.String()
	})
}

// TestEtcdRequiresClientCertificates: the embedded etcd refuses clients
// without a certificate of the cluster CA.
func TestEtcdRequiresClientCertificates(t *testing.T) {
	t.Parallel() // mostly waits out etcd outages and dial timeouts
	env, err := localcluster.NewEnv(t.TempDir(), proctest.Lifeline(t), clustertest.CADir(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	e := env.Etcd
	other, err := pki.Load(clustertest.CertDir(t), "h2") // another cluster's CA
	if err != nil {
		t.Fatal(err)
	}
	for name, tlsConf := range map[string]*tls.Config{"no client certificate": {InsecureSkipVerify: true}, "foreign CA": other} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 2 * time.Second, TLS: tlsConf})
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_, err = cli.Get(ctx, "/x")
			cancel()
			cli.Close()
		}
		if err == nil {
			t.Errorf("%s: etcd answered", name)
		}
	}
}

func TestMain(m *testing.M) { proctest.Main(m) }

// TestControlSocketLeavesNoConnections: 200 nodectl calls leave the
// agent with no more descriptors than before (each call's connection
// closes with its answer; a drill polling the socket once grew every
// agent by a connection and its goroutines per call).
func TestControlSocketLeavesNoConnections(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t)
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	fds := func() int {
		es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", n.Process().Pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	before := fds()
	for range 200 {
		if _, err := nodectl.GetStatus(t.Context(), n.Options.Socket); err != nil {
			t.Fatal(err)
		}
	}
	proctest.WaitFor(t, 5*time.Second, "the agent's descriptors back to what they were", func() (bool, string) {
		now := fds()
		return now <= before+2, fmt.Sprintf("%d descriptors, %d before 200 calls", now, before)
	})
}

// TestAgentFencesAStoppedKVWriter: a worker SIGSTOPped in the middle of a
// generation (holding arena slots it writes directly) cannot renew its KV
// session. Before the owner hands its slots to anyone else the agent
// SIGKILLs it — a stopped process resumed later would otherwise write
// into a slot another writer published meanwhile — and the instance comes
// back at the next generation. Canaries are off: the fence alone acts.
func TestAgentFencesAStoppedKVWriter(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) { o.CanaryIdle = agent.Duration(time.Hour) })
	const id = "n1-decode-tiny-0"
	reg := n.WaitRegistration(t, id, 0)
	pid := n.NodectlWorkers(t)[0].PID
	tlsConf, _ := workerclient.ClientTLS(n.Env.Certs)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := workerclient.Dial(ctx, reg.Addr, tlsConf, id, reg.Generation)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Generate(ctx, &wire.Generate{RequestId: "held", Prompt: "Once upon a time", MaxTokens: 400, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	next := n.WaitRegistration(t, id, reg.Generation)
	if !strings.Contains(n.Log.String(), "KV session expired: writer killed before its slots are reclaimed") {
		t.Fatalf("the worker was not fenced; agent log:\n%s", n.Log.String())
	}
	proctest.WaitFor(t, 10*time.Second, "the stopped worker gone", func() (bool, string) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || strings.Contains(string(st), ") Z "), string(st)
	})
	t.Logf("stopped worker fenced and back at generation %d (was %d) %v after the SIGSTOP", next.Generation, reg.Generation, time.Since(stopped).Round(time.Millisecond))
}

// TestWorkerStopsWhenItsAgentNeverComesBack: the agent is SIGKILLed and
// not restarted: its worker, orphaned (nobody to supervise, adopt or drain
// it), stops by itself once the agent's socket has been gone for
// worker_orphan_timeout (3 s here; 3 minutes by default). (Its stderr,
// the agent's pipe here, is closed with the agent: the worker ignores
// SIGPIPE so that a broken log pipe does not kill it either.)
// It used to run on forever: an audit found four, 43 minutes old, 1 GB of
// RSS each.
func TestWorkerStopsWhenItsAgentNeverComesBack(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) {
		o.WorkerOrphanTimeout = agent.Duration(3 * time.Second)
	})
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	ws := n.NodectlWorkers(t)
	if len(ws) != 1 || ws[0].PID == 0 {
		t.Fatalf("workers: %+v", ws)
	}
	pid := ws[0].PID
	killed := time.Now()
	n.Signal(syscall.SIGKILL)
	<-n.Exited()
	// The worker is not the test's child: it is gone when /proc has no
	// live process of that pid (a zombie reparented to init is reaped).
	proctest.WaitFor(t, 30*time.Second, "the orphaned worker to stop", func() (bool, string) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || strings.Contains(string(stat), ") Z "), string(stat)
	})
	took := time.Since(killed)
	// The worker last saw its agent at most one check (timeout/6) before
	// the kill.
	if took < 2500*time.Millisecond {
		t.Fatalf("the worker stopped %v after its agent died, before the 3 s orphan timeout", took)
	}
	t.Logf("orphaned worker stopped %v after its agent's SIGKILL", took.Round(time.Millisecond))
}
