package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/client"
	"github.com/lifeline-llm/lifeline/internal/netns"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestMultiHostDeployment runs docs/deploy.md's commands on three "hosts"
// made of network namespaces on a bridge, each with its own directories
// and certificates: a CA and a certificate per component and host, a
// 3-member etcd across the hosts (mutual TLS on both ports, peers on the
// hosts' addresses), etcd-setup, an agent per host (workers bound to the
// host's address), and frontends on two of them. Seeded streams run
// through the Go client with both frontends' URLs, half over HTTP/3, half
// over TCP (HTTPS); one host's link is then cut — its etcd member, its
// agent and worker, and a frontend gone with it: every stream completes,
// identical to a fault-free run. A cut frontend's QUIC connections end by
// their idle timeout, its TCP ones by the streams' silence (no keep-alive
// comment for the client's ReadIdle).
func TestMultiHostDeployment(t *testing.T) {
	proctest.Processes(t)
	if err := netns.Available(); err != nil {
		if os.Getenv("LIFELINE_CI") != "" {
			t.Fatalf("network namespaces: %v (CI runs as root)", err)
		}
		t.Skip(err)
	}
	nt, err := netns.Create(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nt.Close() })
	bin, dir := proctest.Lifeline(t), t.TempDir()
	ip := func(i int) string { return nt.Nodes[i].IP.String() }
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("lifeline %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// 1. Certificates, on the admin host (here: the root namespace).
	ca := filepath.Join(dir, "ca")
	run("certs", "init", "--dir", ca)
	host := func(i int, d string) string { return filepath.Join(dir, fmt.Sprintf("h%d", i), d) }
	for i := range 3 {
		run("certs", "issue", "--ca", ca, "--role", "etcd", "--name", fmt.Sprintf("h%d", i), "--host", ip(i), "--dir", host(i, "etcd-certs"))
		run("certs", "issue", "--ca", ca, "--role", "agent", "--name", fmt.Sprintf("h%d", i), "--host", ip(i), "--dir", host(i, "agent-certs"))
	}
	for i := range 2 {
		run("certs", "issue", "--ca", ca, "--role", "frontend", "--name", fmt.Sprintf("fe%d", i), "--host", ip(i), "--dir", host(i, "frontend-certs"))
	}
	admin := filepath.Join(dir, "admin-certs")
	run("certs", "issue", "--ca", ca, "--role", "admin", "--name", "ops", "--dir", admin)

	// 2. etcd, one member per host, then its users and roles.
	var initial, endpoints []string
	for i := range 3 {
		initial = append(initial, fmt.Sprintf("h%d=https://%s", i, net.JoinHostPort(ip(i), "2380")))
		endpoints = append(endpoints, net.JoinHostPort(ip(i), "2379"))
	}
	for i := range 3 {
		start(t, nt.Nodes[i], bin, "etcd", "--name", fmt.Sprintf("h%d", i), "--data-dir", host(i, "etcd-data"), "--certs", host(i, "etcd-certs"),
			"--client-port", "2379", "--peer-port", "2380", "--client-host", ip(i), "--peer-host", ip(i), "--initial-cluster", strings.Join(initial, ","))
	}
	setup := []string{"certs", "etcd-setup", "--etcd", strings.Join(endpoints, ","), "--certs", admin, "--ca", ca,
		"--node", "h0", "--node", "h1", "--node", "h2", "--frontend", "fe0", "--frontend", "fe1"}
	proctest.WaitFor(t, time.Minute, "etcd's quorum and etcd-setup", func() (bool, string) {
		out, err := exec.Command(bin, setup...).CombinedOutput()
		return err == nil, string(out)
	})

	// 3. An agent per host.
	for i := range 3 {
		cfg := map[string]any{"node_id": fmt.Sprintf("h%d", i), "data_dir": host(i, "agent-data"), "etcd": endpoints, "etcd_tls": true,
			"certs": host(i, "agent-certs"), "arena": filepath.Join("/dev/shm", fmt.Sprintf("lifeline-mh-%d-%d", os.Getpid(), i)),
			"arena_slots": 256, "bind_address": ip(i), "transfer_listen": net.JoinHostPort(ip(i), "7480"), "metrics_listen": "127.0.0.1:0",
			"instances": []map[string]any{{"role": "decode", "preset": "tiny", "count": 1}},
			// Longer than the etcd client's keep-alive (7 s): an agent whose
			// member is cut off keeps its lease through another.
			"lease_ttl": "10s"}
		b, _ := json.Marshal(cfg)
		path := host(i, "agent.json")
		os.WriteFile(path, b, 0o600)
		start(t, nt.Nodes[i], bin, "agent", "--config", path, "--socket", host(i, "agent.sock"))
		t.Cleanup(func() { os.Remove(cfg["arena"].(string)) })
	}

	// 4. Frontends on h0 and h1.
	var urls []string
	for i := range 2 {
		url := "https://" + net.JoinHostPort(ip(i), "8080")
		urls = append(urls, url)
		start(t, nt.Nodes[i], bin, "frontend", "--id", fmt.Sprintf("fe%d", i), "--listen", net.JoinHostPort(ip(i), "8080"), "--advertise-url", url,
			"--etcd", strings.Join(endpoints, ","), "--etcd-tls", "--certs", host(i, "frontend-certs"), "--tls")
	}
	pem, err := os.ReadFile(filepath.Join(ca, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	const streams = 6
	// HTTP/3 for the first half of the streams, TCP for the others.
	optsFor := func(k int) client.Options {
		return client.Options{TLS: &tls.Config{RootCAs: roots}, H3: k < streams/2, MaxReconnects: 30}
	}
	temp := 0.9
	req := func(k int) client.Request {
		return client.Request{Model: "tiny", Prompt: fmt.Sprintf("Host story %d began when", k), MaxTokens: 240, Temperature: &temp, Seed: uint64(40 + k), IgnoreEOS: true}
	}
	stream := func(c *client.Client, k int, each func(int)) ([]int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var ids []int
		_, err := c.Stream(ctx, req(k), func(tok client.Token) {
			ids = append(ids, tok.TokenID)
			if each != nil {
				each(tok.SequenceNo)
			}
		})
		return ids, err
	}
	// Serving: every agent's worker registered and both frontends answer.
	want := make([][]int, streams)
	proctest.WaitFor(t, 2*time.Minute, "the fleet serving through both frontends", func() (bool, string) {
		for _, u := range urls {
			c := client.NewWith(optsFor(0), u)
			_, err := stream(c, 0, nil)
			c.Close()
			if err != nil {
				return false, err.Error()
			}
		}
		return true, ""
	})
	for k := range streams {
		c := client.NewWith(optsFor(k), urls[k%2])
		ids, err := stream(c, k, nil)
		c.Close()
		if err != nil {
			t.Fatalf("fault-free stream %d: %v", k, err)
		}
		want[k] = ids
	}

	// Streams through both frontends; h1 cut off once each passed 30.
	var wg sync.WaitGroup
	passed := sync.WaitGroup{}
	passed.Add(streams)
	got, errs := make([][]int, streams), make([]error, streams)
	for k := range streams {
		wg.Go(func() {
			c := client.NewWith(optsFor(k), urls[k%2], urls[(k+1)%2])
			defer c.Close()
			once := sync.Once{}
			got[k], errs[k] = stream(c, k, func(seq int) {
				if seq >= 30 {
					once.Do(passed.Done)
				}
			})
			once.Do(passed.Done)
		})
	}
	passed.Wait()
	if err := nt.Nodes[1].Cut(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for k := range streams {
		if errs[k] != nil {
			t.Errorf("stream %d after h1 was cut off: %v", k, errs[k])
			continue
		}
		if fmt.Sprint(got[k]) != fmt.Sprint(want[k]) {
			t.Errorf("stream %d: %d tokens, not the fault-free run's %d", k, len(got[k]), len(want[k]))
		}
	}
}

// start runs lifeline argv in node's namespace until the test ends
// (SIGTERM, then SIGKILL).
func start(t *testing.T, node *netns.Node, bin string, argv ...string) {
	t.Helper()
	var log proctest.SyncBuffer
	cmd := exec.Command(bin, node.Wrap(bin, append([]string{bin}, argv...))[1:]...)
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			out := log.String()
			if len(out) > 4000 {
				out = out[len(out)-4000:]
			}
			t.Logf("%s in %s:\n%s", argv[0], node.Name, out)
		}
	})
}
