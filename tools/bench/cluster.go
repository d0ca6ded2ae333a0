package main

import (
	"bufio"
	"encoding/json"
	"fmt"
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

// benchCluster is two node agents (b0, b1) with one small decode worker
// each, on an embedded etcd, all real processes of a freshly built binary.
type benchCluster struct {
	dir, bin, certs string
	etcd            *embedetcd.Server
	cli             *clientv3.Client
	socks           []string
	arenas          []string
	procs           []*exec.Cmd
	regs            map[string]schema.Registration
}

// startBenchCluster starts the cluster; prefillOn names nodes that also
// run a small prefill instance.
func startBenchCluster(slots int, prefillOn ...int) (c *benchCluster, err error) {
	c = &benchCluster{regs: map[string]schema.Registration{}}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	if c.dir, err = os.MkdirTemp("", "lifeline-fe-bench"); err != nil {
		return nil, err
	}
	c.bin = filepath.Join(c.dir, "lifeline")
	if out, err := exec.Command("go", "build", "-o", c.bin, "./cmd/lifeline").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build: %v\n%s", err, out)
	}
	c.certs = filepath.Join(c.dir, "certs")
	if err := pki.Init(c.certs, nil); err != nil {
		return nil, err
	}
	if c.etcd, err = embedetcd.Start(filepath.Join(c.dir, "etcd"), 0, c.certs); err != nil {
		return nil, err
	}
	etcdTLS, _ := pki.Load(c.certs, "h2")
	if c.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{c.etcd.Endpoint}, DialTimeout: 5 * time.Second, TLS: etcdTLS}); err != nil {
		return nil, err
	}
	for i := 0; i < 2; i++ {
		node := filepath.Join(c.dir, fmt.Sprintf("node-%d", i))
		os.MkdirAll(node, 0o700)
		sock := filepath.Join(node, "agent.sock")
		c.socks = append(c.socks, sock)
		arena := filepath.Join("/dev/shm", fmt.Sprintf("lifeline-febench-%d-%d-%d", os.Getpid(), time.Now().UnixNano(), i))
		instances := []map[string]any{{"role": "decode", "preset": "small", "count": 1}}
		if slices.Contains(prefillOn, i) {
			instances = append(instances, map[string]any{"role": "prefill", "preset": "small", "count": 1})
		}
		c.arenas = append(c.arenas, arena)
		cfg, _ := json.Marshal(map[string]any{"node_id": fmt.Sprintf("b%d", i), "data_dir": node, "socket": sock, "etcd": []string{c.etcd.Endpoint},
			"etcd_tls": true, "certs": c.certs, "arena": arena, "arena_slots": slots, "arena_slot_bytes": 131072, "canary_idle": "1h",
			"restart_backoff": "20ms", "restart_backoff_max": "50ms", "crash_loop_limit": 1000, "worker_binary": c.bin,
			"instances": instances})
		os.WriteFile(filepath.Join(node, "agent.json"), cfg, 0o600)
		cmd := exec.Command(c.bin, "agent", "--config", filepath.Join(node, "agent.json"))
		cmd.WaitDelay = time.Second
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		c.procs = append(c.procs, cmd)
	}
	ids := []string{"b0-decode-small-0", "b1-decode-small-0"}
	for _, n := range prefillOn {
		ids = append(ids, fmt.Sprintf("b%d-prefill-small-0", n))
	}
	for _, id := range ids {
		r, err := waitReady(c.cli, schema.InstancesPrefix+id, 0)
		if err != nil {
			return nil, err
		}
		c.regs[id] = r
	}
	return c, nil
}

// frontend starts a frontend with extra flags and returns its URL.
func (c *benchCluster) frontend(extra ...string) (string, error) {
	fe := exec.Command(c.bin, append([]string{"frontend", "--listen", "127.0.0.1:0", "--etcd", c.etcd.Endpoint, "--etcd-tls", "--certs", c.certs}, extra...)...)
	stderr, _ := fe.StderrPipe()
	fe.WaitDelay = time.Second
	if err := fe.Start(); err != nil {
		return "", err
	}
	c.procs = append(c.procs, fe)
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "frontend: listening on "); ok {
			go func() {
				for sc.Scan() {
				}
			}()
			return "http://" + a, nil
		}
	}
	return "", fmt.Errorf("frontend exited before listening")
}

// sockOf is the control socket of the node running instance ("b1-…" runs
// on node 1).
func (c *benchCluster) sockOf(instance string) string {
	if strings.HasPrefix(instance, "b1") {
		return c.socks[1]
	}
	return c.socks[0]
}

// kill SIGKILLs instance's worker and says when.
func (c *benchCluster) kill(instance string) time.Time {
	var ws []controlapi.Worker
	getJSON(unixClient(c.sockOf(instance)), "/v1/workers", &ws)
	at := time.Now()
	for _, w := range ws {
		if w.InstanceID == instance {
			syscall.Kill(w.PID, syscall.SIGKILL)
		}
	}
	return at
}

func (c *benchCluster) close() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].Process.Signal(syscall.SIGTERM)
		c.procs[i].Wait()
	}
	if c.cli != nil {
		c.cli.Close()
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
	for _, a := range c.arenas {
		os.Remove(a)
	}
	if c.dir != "" {
		os.RemoveAll(c.dir)
	}
}
