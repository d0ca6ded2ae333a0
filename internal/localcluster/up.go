package localcluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
)

// up is a running `lifeline up`.
type up struct {
	env      *Env
	nodes    []*Node
	frontend *Frontend
	log      *os.File
	// died receives the name of a child that exited while everything
	// should be running.
	died chan string
}

// Run starts everything, prints how to use it to out, and stops
// everything when ctx ends.
func Run(ctx context.Context, opts Options, out io.Writer) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	dir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	env, err := NewEnv(dir, opts.Binary, "")
	if err != nil {
		return err
	}
	defer env.Close()
	u := &up{env: env, died: make(chan string, 16)}
	if u.log, err = os.OpenFile(filepath.Join(dir, "lifeline.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
		return err
	}
	defer u.log.Close()
	defer u.stop()
	if err := u.startNodes(opts); err != nil {
		return err
	}
	if u.frontend, err = env.LaunchFrontend(opts.Listen, u.log); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	select {
	case <-u.frontend.Ready():
	case <-u.frontend.Exited():
		return fmt.Errorf("up: the frontend exited while starting; see %s", u.log.Name())
	case name := <-u.died:
		return fmt.Errorf("up: %s exited while starting; see %s", name, u.log.Name())
	case <-time.After(time.Minute):
		return fmt.Errorf("up: the frontend did not start within a minute; see %s", u.log.Name())
	case <-ctx.Done():
		return nil
	}
	u.watch(u.frontend.Exited(), "frontend")
	u.printUsage(out, opts)
	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "stopping…")
		return nil
	case name := <-u.died:
		return fmt.Errorf("up: %s exited; stopping everything (see %s)", name, u.log.Name())
	}
}

// startNodes starts one agent per node, each with a decode instance;
// prefill instance k goes to node Nodes-1-(k mod Nodes).
func (u *up) startNodes(opts Options) error {
	for i := 0; i < opts.Nodes; i++ {
		dir := filepath.Join(u.env.Dir, fmt.Sprintf("node-%d", i))
		o := u.env.NodeOptions(fmt.Sprintf("node-%d", i), dir)
		o.DataDir = dir
		o.ArenaPath = filepath.Join("/dev/shm", fmt.Sprintf("lifeline-up-%d-node-%d", os.Getpid(), i))
		o.ArenaSlots, o.ArenaSlotBytes = 256, 131072
		o.WorkerBinary = ""
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: opts.Preset, Count: 1}}
		if np := opts.Prefill/opts.Nodes + b2i((opts.Nodes-1-i) < opts.Prefill%opts.Nodes); np > 0 {
			o.Instances = append(o.Instances, agent.InstanceSpec{Role: "prefill", Preset: opts.Preset, Count: np})
		}
		n := u.env.NewNode(o)
		n.Stdout, n.Stderr = u.log, u.log
		if err := n.Start(); err != nil {
			return fmt.Errorf("up: %w", err)
		}
		u.nodes = append(u.nodes, n)
		u.watch(n.Exited(), fmt.Sprintf("agent %d", i))
	}
	return nil
}

func (u *up) watch(exited <-chan struct{}, name string) {
	go func() {
		<-exited
		select {
		case u.died <- name:
		default:
		}
	}()
}

// stop stops the frontend, then the agents (which stop their workers).
func (u *up) stop() {
	if u.frontend != nil {
		u.frontend.Stop(20 * time.Second)
	}
	for i := len(u.nodes) - 1; i >= 0; i-- {
		u.nodes[i].Signal(syscall.SIGTERM)
	}
	for _, n := range u.nodes {
		n.Wait(20 * time.Second)
		n.RemoveArena()
	}
}

func (u *up) printUsage(out io.Writer, opts Options) {
	url := u.frontend.URL
	fmt.Fprintf(out, "Lifeline is up: %d node(s), %d prefill instance(s), preset %s, etcd %s (mutual TLS), logs in %s\n\n",
		opts.Nodes, opts.Prefill, opts.Preset, u.env.Etcd.Endpoint, u.log.Name())
	fmt.Fprintf(out, "  curl -N %s/v1/completions -H 'Content-Type: application/json' \\\n", url)
	fmt.Fprintf(out, "    -d '{\"model\":\"%s\",\"prompt\":\"Once upon a time\",\"max_tokens\":64,\"seed\":7,\"stream\":true}'\n\n", opts.Preset)
	for _, n := range u.nodes {
		fmt.Fprintf(out, "  nodectl --socket %s status\n", n.Options.Socket)
	}
	fmt.Fprintf(out, "\nURL %s\nCtrl-C stops everything.\n", url)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
