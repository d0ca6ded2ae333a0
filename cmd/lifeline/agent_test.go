package main

import (
	"bytes"
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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/cgtest"
	"github.com/lifeline-llm/lifeline/internal/embedetcd"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

type agentNode struct {
	etcd    *embedetcd.Server
	cli     *clientv3.Client
	dir     string
	socket  string
	config  string
	cmd     *exec.Cmd
	exited  chan struct{}
	stderr  *syncBuffer
	arena   string
	certDir string
	// wrap, when set, rewrites the agent's command (e.g. to start it in a
	// cgroup).
	wrap func(*exec.Cmd) *exec.Cmd
	// env is added to the agent's (and so its workers') environment.
	env []string
}

// startEtcd runs an embedded etcd that requires mutual TLS with the
// cluster's certificates, and a client of it.
func startEtcd(t *testing.T, certs string) (*embedetcd.Server, *clientv3.Client) {
	t.Helper()
	e, err := embedetcd.Start(t.TempDir(), 0, certs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	tlsConf, err := pki.Load(certs, "h2")
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, TLS: tlsConf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return e, cli
}

func newAgentNode(t *testing.T, extra map[string]any, wrap ...func(*exec.Cmd) *exec.Cmd) *agentNode {
	t.Helper()
	certs := certDir(t)
	e, cli := startEtcd(t, certs)
	return startAgentNode(t, &agentNode{etcd: e, cli: cli, certDir: certs}, "n1", extra, wrap...)
}

// startAgentNode configures and starts the agent of node nodeID on n's
// etcd and certificates, with its own directory and arena; extra
// overrides configuration keys ("_env" adds to its environment).
func startAgentNode(t *testing.T, n *agentNode, nodeID string, extra map[string]any, wrap ...func(*exec.Cmd) *exec.Cmd) *agentNode {
	t.Helper()
	n.dir = t.TempDir()
	f, err := os.CreateTemp("/dev/shm", "lifeline-agent-*")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Remove(f.Name())
	n.arena = f.Name()
	t.Cleanup(func() { os.Remove(n.arena) })
	n.socket = filepath.Join(n.dir, "agent.sock")
	cfg := map[string]any{
		"node_id": nodeID, "data_dir": filepath.Join(n.dir, "data"), "socket": n.socket, "etcd": []string{n.etcd.Endpoint}, "etcd_tls": true,
		"certs": n.certDir, "arena": n.arena, "arena_slots": 128, "arena_slot_bytes": 8192,
		"instances": []map[string]any{{"role": "decode", "preset": "tiny", "count": 1}},
		"lease_ttl": "3s", "canary_idle": "1s", "canary_timeout": "1s",
		"worker_binary": binary,
	}
	for k, v := range extra {
		if k == "_env" {
			n.env = v.([]string)
			continue
		}
		cfg[k] = v
	}
	b, _ := json.Marshal(cfg)
	n.config = filepath.Join(n.dir, "agent.json")
	os.WriteFile(n.config, b, 0o600)
	if len(wrap) > 0 {
		n.wrap = wrap[0]
	}
	n.start(t)
	return n
}

func (n *agentNode) start(t *testing.T) {
	t.Helper()
	n.cmd = exec.Command(binary, "agent", "--config", n.config)
	if len(n.env) > 0 {
		n.cmd.Env = append(os.Environ(), n.env...)
	}
	if n.wrap != nil {
		n.cmd = n.wrap(n.cmd)
	}
	n.stderr = &syncBuffer{}
	n.cmd.Stderr = n.stderr
	// Workers inherit the agent's stderr and may outlive it (that is the
	// point of adoption): do not wait for them to close it.
	n.cmd.WaitDelay = time.Second
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	n.exited = exited
	cmd := n.cmd
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			cmd.Process.Signal(syscall.SIGTERM)
			<-exited
		}
	})
}

func (n *agentNode) nodectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(nodectlBinary, append([]string{"--socket", n.socket}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nodectl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// waitRegistration waits for a ready registration of instance at a
// generation above after.
func (n *agentNode) waitRegistration(t *testing.T, instance string, after uint64) schema.Registration {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-n.exited:
			t.Fatalf("agent exited; log:\n%s", n.stderr.String())
		default:
		}
		resp, err := n.cli.Get(context.Background(), schema.InstancesPrefix+instance)
		if err == nil && len(resp.Kvs) == 1 {
			var r schema.Registration
			json.Unmarshal(resp.Kvs[0].Value, &r)
			if r.Ready && r.Generation > after {
				return r
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no ready registration of %s above generation %d; agent log:\n%s", instance, after, n.stderr.String())
	return schema.Registration{}
}

// waitWorkerReady polls nodectl until the (single) worker is ready.
func (n *agentNode) waitWorkerReady(t *testing.T) controlapi.Worker {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		out, err := exec.Command(nodectlBinary, "--socket", n.socket, "workers", "--json").Output()
		var ws []controlapi.Worker
		if err == nil && json.Unmarshal(out, &ws) == nil && len(ws) == 1 && ws[0].Ready {
			return ws[0]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("worker never ready; agent log:\n%s", n.stderr.String())
	return controlapi.Worker{}
}

func (n *agentNode) workers(t *testing.T) []controlapi.Worker {
	t.Helper()
	var ws []controlapi.Worker
	if err := json.Unmarshal([]byte(n.nodectl(t, "workers", "--json")), &ws); err != nil {
		t.Fatal(err)
	}
	return ws
}

// TestAgentDetectsWorkerKill: SIGKILL a worker. The agent's eBPF detector
// (as root) sees it, the registration is gone and a failure is announced in
// etcd without waiting for any lease, and the instance comes back at the
// next generation once a canary passed.
func TestAgentDetectsWorkerKill(t *testing.T) {
	metricsAddr := freeTCPAddr(t)
	n := newAgentNode(t, map[string]any{"metrics_listen": metricsAddr})
	const id = "n1-decode-tiny-0"
	reg := n.waitRegistration(t, id, 0)
	ws := n.workers(t)
	if len(ws) != 1 || ws[0].PID == 0 || ws[0].Generation != reg.Generation || !ws[0].Ready {
		t.Fatalf("workers: %+v", ws)
	}
	watch := n.cli.Watch(context.Background(), schema.InstancesPrefix+id)
	failures := n.cli.Watch(context.Background(), schema.FailuresPrefix+id)

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
			t.Fatalf("no deregistration/announcement within 10s; agent log:\n%s", n.stderr.String())
		}
	}
	// Kill → agent event (kernel time of the exit tracepoint).
	var exitEvent controlapi.Event
	for _, line := range strings.Split(strings.TrimSpace(n.nodectl(t, "events")), "\n") {
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
	next := n.waitRegistration(t, id, reg.Generation)
	if next.Generation != reg.Generation+1 {
		t.Fatalf("back at generation %d, want %d", next.Generation, reg.Generation+1)
	}
	ws = n.workers(t)
	if ws[0].LastExit == nil || ws[0].LastExit.Reason != controlapi.ReasonSignal || ws[0].Restarts != 1 || ws[0].Generation != next.Generation {
		t.Fatalf("workers after restart: %+v", ws[0])
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
	n.cmd.Process.Signal(syscall.SIGTERM)
	<-n.exited
	if err := syscall.Kill(ws[0].PID, 0); err == nil {
		t.Fatal("worker survived the agent's clean stop")
	}
	if resp, err := n.cli.Get(context.Background(), schema.InstancesPrefix, clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("registrations left after a clean stop: %v %v", resp, err)
	}
}

func TestAgentBadConfig(t *testing.T) {
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
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "lease_ttl": "2500ms"}`, "lease_ttl"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "instances": [{"role": "decode", "preset": "tiny", "count": 1}, {"role": "decode", "preset": "tiny", "count": 2}]}`, "instances[1]"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "worker_cgroup": "/nonexistent/cg"}`, "worker_cgroup"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "transfer_listen": "0.0.0.0:7480"}`, "transfer_advertise"},
		{`{"node_id": "a", "data_dir": "d", "socket": "s", "etcd": ["x:1"], "certs": "c", "arena": "/dev/shm/x", "transfer_listen": "nonsense"}`, "transfer_listen"},
	} {
		p := filepath.Join(dir, "agent.json")
		os.WriteFile(p, []byte(c.cfg), 0o600)
		_, errOut, err := run(t, "agent", "--config", p, "--check-config")
		if err == nil || !strings.Contains(errOut, c.want) || strings.Contains(errOut, "panic") {
			t.Errorf("%s: err %v, stderr %q (want it to name %q)", c.cfg, err, errOut, c.want)
		}
	}
	good := fmt.Sprintf(`{"node_id": "a", "data_dir": %q, "socket": "s", "etcd": ["127.0.0.1:1"], "certs": "c", "arena": "/dev/shm/x"}`, dir)
	p := filepath.Join(dir, "good.json")
	os.WriteFile(p, []byte(good), 0o600)
	if out, errOut, err := run(t, "agent", "--config", p, "--check-config"); err != nil || !strings.Contains(out, "config OK") {
		t.Fatalf("good config: %v %s %s", err, out, errOut)
	}
}

// syncBuffer collects a process's stderr for failure messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAgentRestartAdoptsWorkers: the agent is SIGKILLed while a stream is
// in flight. The worker keeps running and keeps streaming; the restarted
// agent adopts it at the same pid and generation instead of restarting
// it, and still detects its death afterwards.
func TestAgentRestartAdoptsWorkers(t *testing.T) {
	n := newAgentNode(t, nil)
	const id = "n1-decode-tiny-0"
	reg := n.waitRegistration(t, id, 0)
	before := n.workers(t)[0]

	tlsConf, err := workerclient.ClientTLS(n.certDir)
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
	n.cmd.Process.Kill()
	<-n.exited
	n.start(t)
	frames := collectFrames(t, s)
	if last := frames[len(frames)-1]; last.FinishReason != "length" || len(frames) != 480 {
		t.Fatalf("stream across the agent restart: %d frames, last %+v", len(frames), last)
	}
	after := n.waitWorkerReady(t)
	again := n.waitRegistration(t, id, 0)
	if after.PID != before.PID || after.Generation != before.Generation || again.Generation != reg.Generation {
		t.Fatalf("restarted agent did not adopt: before %+v, after %+v", before, after)
	}
	if err := syscall.Kill(after.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	next := n.waitRegistration(t, id, reg.Generation)
	if next.Generation != reg.Generation+1 {
		t.Fatalf("after the adopted worker died: generation %d", next.Generation)
	}
}

// TestAgentCanaryCatchesStoppedWorker: a SIGSTOPped worker still has its
// process and its socket, but its canary times out: the instance goes not
// ready within the canary window and is restarted (at generation + 1) after
// the failure threshold.
func TestAgentCanaryCatchesStoppedWorker(t *testing.T) {
	n := newAgentNode(t, map[string]any{"canary_idle": "300ms", "canary_timeout": "300ms", "canary_failures": 2})
	const id = "n1-decode-tiny-0"
	reg := n.waitRegistration(t, id, 0)
	w := n.workers(t)[0]
	stopped := time.Now()
	if err := syscall.Kill(w.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(w.PID, syscall.SIGCONT)
	// Not ready (deregistered) within a few canary windows.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := n.cli.Get(context.Background(), schema.InstancesPrefix+id)
		if err == nil && len(resp.Kvs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stopped worker still registered after 10s; log:\n%s", n.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("SIGSTOP → not ready after %v", time.Since(stopped))
	next := n.waitRegistration(t, id, reg.Generation)
	ws := n.workers(t)
	if next.Generation != reg.Generation+1 || ws[0].LastExit == nil || ws[0].LastExit.Reason != controlapi.ReasonCanaryTimeout {
		t.Fatalf("after the canary threshold: generation %d, last exit %+v", next.Generation, ws[0].LastExit)
	}
}

func TestAgentControlSocketBadRequests(t *testing.T) {
	n := newAgentNode(t, nil)
	n.waitRegistration(t, "n1-decode-tiny-0", 0)
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", n.socket)
	}}}
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/v1/nope", 404},
		{"POST", "/v1/status", 404},
		{"DELETE", "/v1/workers", 404},
		{"GET", "/v1/events?follow=maybe", 400},
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
	conn, err := net.Dial("unix", n.socket)
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("\x00\xff not http at all\r\n\r\n"))
	conn.Close()
	if st, err := os.Stat(n.socket); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("control socket mode: %v %v", st, err)
	}
	// Still serving.
	if out := n.nodectl(t, "status"); !strings.Contains(out, "failure detector") || !strings.Contains(out, "GPU:") {
		t.Fatalf("status after abuse: %s", out)
	}
	// The canary's sequence wrote and published arena blocks? It is short
	// (under one block), so the arena may be empty; kv ls must answer
	// either way, as a JSON array.
	var slots []map[string]any
	if err := json.Unmarshal([]byte(n.nodectl(t, "kv", "ls", "--json")), &slots); err != nil {
		t.Fatalf("kv ls --json: %v", err)
	}
	if out := n.nodectl(t, "kv", "stats"); !strings.Contains(out, "Slots") {
		t.Fatalf("kv stats: %s", out)
	}
}

// TestAgentEtcdOutage: etcd goes away for longer than the lease TTL. An
// in-flight generation completes; once the TTL has passed the node says it
// is not routable and its worker refuses new requests (typed, retryable);
// when etcd is back every instance is re-registered at a higher generation,
// by the same process, and serves again.
func TestAgentEtcdOutage(t *testing.T) {
	n := newAgentNode(t, map[string]any{"lease_ttl": "2s", "canary_idle": "1h"})
	const id = "n1-decode-tiny-0"
	reg := n.waitRegistration(t, id, 0)
	pid := n.workers(t)[0].PID
	tlsConf, _ := workerclient.ClientTLS(n.certDir)
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
	etcdDir, port := n.etcd.Dir(), n.etcd.Port()
	n.etcd.Close()
	down := time.Now()
	// Not routable after the TTL.
	var st controlapi.Status
	for deadline := time.Now().Add(20 * time.Second); ; {
		json.Unmarshal([]byte(n.nodectl(t, "status", "--json")), &st)
		if !st.Etcd.Routable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still routable 20s into an etcd outage")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st.Etcd.LastRenewalMs < 2000 {
		t.Fatalf("not routable %dms after its last renewal, before the 2s TTL", st.Etcd.LastRenewalMs)
	}
	t.Logf("not routable %v after etcd stopped (%dms after the last renewal)", time.Since(down), st.Etcd.LastRenewalMs)
	// New work is refused once the agent has fenced the worker.
	var refused *wire.Frame
	for deadline := time.Now().Add(10 * time.Second); refused == nil; {
		ns, err := c.Generate(ctx, &wire.Generate{RequestId: "new", Prompt: "hi", MaxTokens: 3, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		fs := collectFrames(t, ns)
		if len(fs) == 1 && fs[0].Error.GetCode() == wire.Code_SHUTTING_DOWN && fs[0].Error.GetRetryable() {
			refused = fs[0]
		} else if time.Now().After(deadline) {
			t.Fatalf("new request during the outage: %+v", fs)
		}
	}
	// The in-flight stream is not cut.
	frames := collectFrames(t, s)
	if last := frames[len(frames)-1]; last.FinishReason != "length" {
		t.Fatalf("in-flight stream ended %+v", last)
	}
	// etcd returns: re-registered at a higher generation, same process.
	e2, err := embedetcd.Start(etcdDir, port, n.certDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e2.Close)
	next := n.waitRegistration(t, id, reg.Generation)
	if w := n.workers(t)[0]; w.PID != pid || next.Generation <= reg.Generation {
		t.Fatalf("after the outage: pid %d (was %d), generation %d (was %d)", w.PID, pid, next.Generation, reg.Generation)
	}
	ns, err := c.Generate(ctx, &wire.Generate{RequestId: "after", Prompt: "hi", MaxTokens: 3, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	if fs := collectFrames(t, ns); len(fs) != 4 || fs[0].Generation != next.Generation {
		t.Fatalf("after re-registration: %+v", fs)
	}
}

func freeTCPAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestSystemdUnitVerifies runs systemd's own checker over the unit, pointed
// at the binary under test. CI (.ci/run sets LIFELINE_CI and installs
// systemd when it is missing) never skips it; a developer machine without
// systemd-analyze does.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("LIFELINE_CI") != "" {
			t.Fatal("systemd-analyze is missing in CI: the unit is not verified")
		}
		t.Skip("systemd-analyze is not installed on this machine")
	}
	unit, err := os.ReadFile("../../deploy/lifeline-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "lifeline-agent.service")
	os.WriteFile(p, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/lifeline", binary)), 0o644)
	if out, err := exec.Command(analyze, "verify", p).CombinedOutput(); err != nil {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// workersOf lists the live worker processes whose command line names sock.
func workersOf(t *testing.T, sock string) []int {
	t.Helper()
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid := 0
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err == nil && strings.Contains(string(cmdline), "worker\x00") && strings.Contains(string(cmdline), sock) &&
			!strings.Contains(string(stat), ") Z ") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestAgentStaleDeathsNeverOrphanAWorker: a worker that crashes at start a
// few times in a row (both the detector and the reaper report each death)
// must leave exactly one supervised worker running, never a second one
// whose death report was mistaken for an older process's.
func TestAgentStaleDeathsNeverOrphanAWorker(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "flaky-worker")
	counter := filepath.Join(dir, "starts")
	os.WriteFile(script, []byte(fmt.Sprintf("#!/bin/sh\nn=$(cat %s 2>/dev/null || echo 0)\necho $((n+1)) > %s\n[ $n -lt 5 ] && exit 1\nexec %s \"$@\"\n", counter, counter, binary)), 0o755)
	n := newAgentNode(t, map[string]any{"worker_binary": script, "restart_backoff": "10ms", "restart_backoff_max": "20ms", "crash_loop_limit": 20})
	const id = "n1-decode-tiny-0"
	n.waitRegistration(t, id, 0)
	kvSock := filepath.Join(n.dir, "data", "kv.sock")
	w := n.waitWorkerReady(t)
	// Give any stray death report time to be (mis)used.
	time.Sleep(300 * time.Millisecond)
	pids := workersOf(t, kvSock)
	if len(pids) != 1 || pids[0] != w.PID {
		t.Fatalf("worker processes %v, supervised %d", pids, w.PID)
	}
	if again := n.workers(t)[0]; again.PID != w.PID || !again.Ready {
		t.Fatalf("supervised worker changed: %+v", again)
	}
}

// TestAgentWorkerDeathDuringEtcdOutage: with etcd down a dead worker cannot
// get a new generation; the agent waits for etcd instead of counting it as
// a crash loop, and the instance comes back when etcd does.
func TestAgentWorkerDeathDuringEtcdOutage(t *testing.T) {
	n := newAgentNode(t, map[string]any{"lease_ttl": "2s", "crash_loop_limit": 2})
	const id = "n1-decode-tiny-0"
	reg := n.waitRegistration(t, id, 0)
	pid := n.workers(t)[0].PID
	etcdDir, port := n.etcd.Dir(), n.etcd.Port()
	n.etcd.Close()
	syscall.Kill(pid, syscall.SIGKILL)
	// Well past what the crash-loop limit would allow.
	time.Sleep(5 * time.Second)
	if w := n.workers(t)[0]; w.State == "crash_loop" {
		t.Fatalf("etcd outage counted as a crash loop: %+v", w)
	}
	e2, err := embedetcd.Start(etcdDir, port, n.certDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e2.Close)
	next := n.waitRegistration(t, id, reg.Generation)
	if w := n.workers(t)[0]; w.PID == pid || w.PID == 0 {
		t.Fatalf("instance not restarted after etcd returned: %+v (generation %d)", w, next.Generation)
	}
}

// TestAgentClassifiesOOMKill: the agent places its workers in a memory
// cgroup limited to 256 MiB (worker_cgroup); the worker makes a controlled
// 512 MiB allocation (failpoint) once it serves. The OOM killer takes it,
// never the agent (which stays outside the cgroup), and the agent records
// the death as an OOM kill, not as a signal 9.
func TestAgentClassifiesOOMKill(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: cannot create a memory cgroup")
	}
	dir := cgtest.Memory(t, 256<<20)
	withFailpoint := func(c *exec.Cmd) *exec.Cmd {
		if c.Env == nil {
			c.Env = os.Environ()
		}
		c.Env = append(c.Env, "LIFELINE_FAILPOINTS=worker.after-ready=allocMB:512")
		return c
	}
	n := newAgentNode(t, map[string]any{"crash_loop_limit": 1, "restart_backoff": "5s", "restart_backoff_max": "5s", "worker_cgroup": dir}, withFailpoint)
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, line := range strings.Split(strings.TrimSpace(n.nodectlTry("events")), "\n") {
			var e controlapi.Event
			if json.Unmarshal([]byte(line), &e) == nil && e.Kind == controlapi.EventExit {
				if e.Reason != controlapi.ReasonOOM || e.Signal != 9 || e.Detector != "ebpf" {
					t.Fatalf("OOM kill recorded as %+v", e)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no exit event within 30s; agent log:\n%s", n.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodectlTry runs nodectl and returns its output, or "" if it failed.
func (n *agentNode) nodectlTry(args ...string) string {
	out, err := exec.Command(nodectlBinary, append([]string{"--socket", n.socket}, args...)...).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

// TestEtcdRequiresClientCertificates: the embedded etcd refuses clients
// without a certificate of the cluster CA.
func TestEtcdRequiresClientCertificates(t *testing.T) {
	certs := certDir(t)
	e, _ := startEtcd(t, certs)
	other, err := pki.Load(certDir(t), "h2") // another cluster's CA
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
