package main

import (
	"context"
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
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/embedetcd"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// runDetectionBench measures, for the eBPF and pidfd detectors, kill →
// agent event and kill → etcd key gone over repeated SIGKILLs of a real
// worker under a real agent, next to the lease-expiry path in the same run.
func runDetectionBench(kills int) error {
	fmt.Printf("## Failure detection (%d SIGKILLs of a worker per detector)\n\n", kills)
	if os.Geteuid() != 0 {
		fmt.Printf("skipped: not root (eBPF needs it)\n\n")
		return nil
	}
	dir, err := os.MkdirTemp("", "lifeline-detect")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "lifeline")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/lifeline").CombinedOutput(); err != nil {
		return fmt.Errorf("build lifeline: %v\n%s", err, out)
	}
	certs := filepath.Join(dir, "certs")
	if err := pki.Init(certs, nil); err != nil {
		return err
	}
	etcd, err := embedetcd.Start(filepath.Join(dir, "etcd"), 0, certs)
	if err != nil {
		return err
	}
	defer etcd.Close()
	etcdTLS, err := pki.Load(certs, "h2")
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint}, DialTimeout: 5 * time.Second, TLS: etcdTLS})
	if err != nil {
		return err
	}
	defer cli.Close()

	fmt.Printf("| path | p50 | p99 | samples |\n|---|---|---|---|\n")
	for _, det := range []string{"ebpf", "pidfd"} {
		toEvent, toGone, err := killLoop(dir, bin, certs, etcd.Endpoint, cli, det, kills)
		if err != nil {
			return fmt.Errorf("%s: %w", det, err)
		}
		fmt.Printf("| %s: kill → agent event | %v | %v | %d |\n", det, pct(toEvent, 50), pct(toEvent, 99), len(toEvent))
		fmt.Printf("| %s: kill → etcd key gone (seen by a watcher) | %v | %v | %d |\n", det, pct(toGone, 50), pct(toGone, 99), len(toGone))
	}
	lease, err := leaseExpiry(cli, 5)
	if err != nil {
		return err
	}
	fmt.Printf("| lease expiry (TTL 2s): last keepalive → key gone | %v | %v | %d |\n\n", pct(lease, 50), pct(lease, 99), len(lease))
	return nil
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))].Round(10 * time.Microsecond)
}

func killLoop(dir, bin, certs, endpoint string, cli *clientv3.Client, det string, kills int) (toEvent, toGone []time.Duration, err error) {
	node := "bench-" + det
	data := filepath.Join(dir, node)
	sock := filepath.Join(data, "agent.sock")
	arena := filepath.Join("/dev/shm", "lifeline-bench-"+node+fmt.Sprint(os.Getpid()))
	defer os.Remove(arena)
	cfg, _ := json.Marshal(map[string]any{"node_id": node, "data_dir": data, "socket": sock, "etcd": []string{endpoint}, "etcd_tls": true, "certs": certs,
		"arena": arena, "arena_slots": 64, "arena_slot_bytes": 8192, "detector": det, "worker_binary": bin,
		"instances": []map[string]any{{"role": "decode", "preset": "tiny", "count": 1}}, "canary_idle": "1h",
		"restart_backoff": "10ms", "restart_backoff_max": "10ms", "crash_loop_limit": 1000, "crash_loop_window": "1s"})
	os.MkdirAll(data, 0o700)
	cfgPath := filepath.Join(data, "agent.json")
	os.WriteFile(cfgPath, cfg, 0o600)
	cmd := exec.Command(bin, "agent", "--config", cfgPath)
	logf, _ := os.Create(filepath.Join(data, "agent.log"))
	defer logf.Close()
	cmd.Stderr = logf
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	http := unixClient(sock)
	id := node + "-decode-tiny-0"
	key := schema.InstancesPrefix + id
	var gen uint64
	reaped := 0
	defer func() {
		if reaped > 0 {
			fmt.Printf("| %s: deaths first reported by the reaper (Wait) instead | %d of %d | | |\n", det, reaped, kills)
		}
	}()
	for k := 0; k < kills; k++ {
		reg, err := waitReady(cli, key, gen)
		if err != nil {
			log, _ := os.ReadFile(filepath.Join(data, "agent.log"))
			return nil, nil, fmt.Errorf("%w; agent log:\n%s", err, log)
		}
		gen = reg.Generation
		var ws []controlapi.Worker
		if err := getJSON(http, "/v1/workers", &ws); err != nil || len(ws) != 1 || ws[0].Generation != gen {
			return nil, nil, fmt.Errorf("workers: %v %v", ws, err)
		}
		wctx, cancel := context.WithCancel(context.Background())
		watch := cli.Watch(wctx, key, clientv3.WithRev(0))
		killed := time.Now()
		syscall.Kill(ws[0].PID, syscall.SIGKILL)
		gone := false
		for !gone {
			select {
			case wr := <-watch:
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						toGone = append(toGone, time.Since(killed))
						gone = true
					}
				}
			case <-time.After(10 * time.Second):
				cancel()
				return nil, nil, fmt.Errorf("key not deleted within 10s")
			}
		}
		cancel()
		// The event follows the deregistration by a few steps: poll for it.
		var evs []controlapi.Event
		for deadline := time.Now().Add(5 * time.Second); len(evs) == 0 && time.Now().Before(deadline); {
			resp, err := http.Get("http://agent/v1/events")
			if err != nil {
				return nil, nil, err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				var e controlapi.Event
				if json.Unmarshal([]byte(line), &e) == nil && e.Kind == controlapi.EventExit && e.Generation == gen {
					evs = append(evs, e)
				}
			}
			if len(evs) == 0 {
				time.Sleep(2 * time.Millisecond)
			}
		}
		if len(evs) != 1 || (evs[0].Detector != det && evs[0].Detector != "wait") {
			return nil, nil, fmt.Errorf("exit events for generation %d: %+v", gen, evs)
		}
		if evs[0].Detector == "wait" {
			reaped++
		}
		toEvent = append(toEvent, evs[0].DetectedAt.Sub(killed))
	}
	return toEvent, toGone, nil
}

func waitReady(cli *clientv3.Client, key string, after uint64) (schema.Registration, error) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := cli.Get(context.Background(), key)
		if err == nil && len(resp.Kvs) == 1 {
			var r schema.Registration
			if json.Unmarshal(resp.Kvs[0].Value, &r) == nil && r.Ready && r.Generation > after {
				return r, nil
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return schema.Registration{}, fmt.Errorf("%s not ready above generation %d", key, after)
}

func unixClient(sock string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

func getJSON(c *http.Client, path string, v any) error {
	resp, err := c.Get("http://agent" + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// leaseExpiry measures the path a detector replaces: a key under a 2 s
// lease whose holder stops renewing, as a watcher sees it go.
func leaseExpiry(cli *clientv3.Client, samples int) ([]time.Duration, error) {
	var out []time.Duration
	for i := 0; i < samples; i++ {
		ctx := context.Background()
		g, err := cli.Grant(ctx, 2)
		if err != nil {
			return nil, err
		}
		key := fmt.Sprintf("/lifeline/bench/lease-%d", i)
		if _, err := cli.Put(ctx, key, "x", clientv3.WithLease(g.ID)); err != nil {
			return nil, err
		}
		wctx, cancel := context.WithCancel(ctx)
		watch := cli.Watch(wctx, key)
		if _, err := cli.KeepAliveOnce(ctx, g.ID); err != nil {
			cancel()
			return nil, err
		}
		last := time.Now()
		for done := false; !done; {
			select {
			case wr := <-watch:
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						out = append(out, time.Since(last))
						done = true
					}
				}
			case <-time.After(30 * time.Second):
				cancel()
				return nil, fmt.Errorf("lease never expired")
			}
		}
		cancel()
	}
	return out, nil
}
