// Package localcluster is `lifeline up`: one machine's whole Lifeline — an
// embedded etcd, certificates, N node agents (each with its own arena,
// Badger directory and control socket) running decode workers as real
// processes, and a frontend — started from nothing and stopped cleanly.
package localcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/internal/embedetcd"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// Options are the flags of `lifeline up`.
type Options struct {
	DataDir string
	Nodes   int
	Preset  string
	Listen  string
	// Prefill adds prefill instances, placed on the nodes from the last
	// one backwards (with 2+ nodes a hand-off then crosses nodes for the
	// decode instances elsewhere).
	Prefill int
	// Binary is the lifeline executable for the child processes (default:
	// this executable).
	Binary string
}

// Validate names the first bad field.
func (o *Options) Validate() error {
	switch {
	case o.DataDir == "":
		return fmt.Errorf("up: data-dir: empty")
	case o.Nodes < 1 || o.Nodes > 16:
		return fmt.Errorf("up: nodes: %d (1..16)", o.Nodes)
	case o.Preset != "tiny" && o.Preset != "small":
		return fmt.Errorf("up: preset: %q (tiny or small)", o.Preset)
	case o.Listen == "":
		return fmt.Errorf("up: listen: empty")
	case o.Prefill < 0 || o.Prefill > 16:
		return fmt.Errorf("up: prefill: %d (0..16)", o.Prefill)
	}
	return nil
}

// Run starts everything, prints how to use it to out, and stops
// everything when ctx ends.
func Run(ctx context.Context, opts Options, out io.Writer) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	if opts.Binary == "" {
		opts.Binary, _ = os.Executable()
	}
	dir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return err
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

	type child struct {
		cmd    *exec.Cmd
		name   string
		exited chan struct{}
	}
	var procs []*child
	// died reports a child that exited while everything should be running.
	died := make(chan string, 16)
	start := func(cmd *exec.Cmd, name string) error {
		if err := cmd.Start(); err != nil {
			return err
		}
		c := &child{cmd: cmd, name: name, exited: make(chan struct{})}
		procs = append(procs, c)
		go func() {
			cmd.Wait()
			close(c.exited)
			select {
			case died <- name:
			default:
			}
		}()
		return nil
	}
	defer func() {
		// Agents stop their workers on SIGTERM; then wait for everyone.
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			select {
			case <-p.exited:
			case <-time.After(20 * time.Second):
				p.cmd.Process.Kill()
				<-p.exited
			}
		}
	}()
	logf, err := os.OpenFile(filepath.Join(dir, "lifeline.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	var sockets []string
	for i := 0; i < opts.Nodes; i++ {
		node := filepath.Join(dir, fmt.Sprintf("node-%d", i))
		os.MkdirAll(node, 0o700)
		sock := filepath.Join(node, "agent.sock")
		sockets = append(sockets, sock)
		instances := []map[string]any{{"role": "decode", "preset": opts.Preset, "count": 1}}
		// Prefill instance k goes to node Nodes-1-(k mod Nodes).
		if np := opts.Prefill/opts.Nodes + b2i((opts.Nodes-1-i) < opts.Prefill%opts.Nodes); np > 0 {
			instances = append(instances, map[string]any{"role": "prefill", "preset": opts.Preset, "count": np})
		}
		cfg, _ := json.Marshal(map[string]any{
			"node_id": fmt.Sprintf("node-%d", i), "data_dir": node, "socket": sock, "etcd": []string{etcd.Endpoint}, "etcd_tls": true,
			"certs": certs, "arena": filepath.Join("/dev/shm", fmt.Sprintf("lifeline-up-%d-node-%d", os.Getpid(), i)),
			"arena_slots": 256, "arena_slot_bytes": 131072,
			"instances": instances,
		})
		cfgPath := filepath.Join(node, "agent.json")
		if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
			return err
		}
		cmd := exec.Command(opts.Binary, "agent", "--config", cfgPath)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.WaitDelay = time.Second
		if err := start(cmd, fmt.Sprintf("agent %d", i)); err != nil {
			return fmt.Errorf("up: start agent %d: %w", i, err)
		}
		defer os.Remove(filepath.Join("/dev/shm", fmt.Sprintf("lifeline-up-%d-node-%d", os.Getpid(), i)))
	}
	fe := exec.Command(opts.Binary, "frontend", "--listen", opts.Listen, "--etcd", etcd.Endpoint, "--etcd-tls", "--certs", certs)
	stderr, err := fe.StderrPipe()
	if err != nil {
		return err
	}
	fe.Stdout = logf
	fe.WaitDelay = time.Second
	if err := start(fe, "frontend"); err != nil {
		return fmt.Errorf("up: start frontend: %w", err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if a, ok := strings.CutPrefix(line, "frontend: listening on "); ok {
				addr <- a
			}
			fmt.Fprintln(logf, line)
		}
	}()
	var url string
	select {
	case a := <-addr:
		url = "http://" + a
	case name := <-died:
		return fmt.Errorf("up: %s exited while starting; see %s", name, logf.Name())
	case <-time.After(60 * time.Second):
		return fmt.Errorf("up: the frontend did not start; see %s", logf.Name())
	case <-ctx.Done():
		return nil
	}
	fmt.Fprintf(out, "Lifeline is up: %d node(s), %d prefill instance(s), preset %s, etcd %s (mutual TLS), logs in %s\n\n", opts.Nodes, opts.Prefill, opts.Preset, etcd.Endpoint, logf.Name())
	fmt.Fprintf(out, "  curl -N %s/v1/completions -H 'Content-Type: application/json' \\\n", url)
	fmt.Fprintf(out, "    -d '{\"model\":\"%s\",\"prompt\":\"Once upon a time\",\"max_tokens\":64,\"seed\":7,\"stream\":true}'\n\n", opts.Preset)
	for _, s := range sockets {
		fmt.Fprintf(out, "  nodectl --socket %s status\n", s)
	}
	fmt.Fprintf(out, "\nURL %s\nCtrl-C stops everything.\n", url)
	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "stopping…")
		return nil
	case name := <-died:
		return fmt.Errorf("up: %s exited; stopping everything (see %s)", name, logf.Name())
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
