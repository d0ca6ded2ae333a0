package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/internal/netns"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// Node is one node agent run as a process of the Env's binary, with its
// own directory, configuration file, arena and control socket.
type Node struct {
	env     *Env
	Options agent.Options
	// Config is the agent's configuration file, written from Options by
	// Start.
	Config string
	// ExtraEnv is added to the agent's environment, and so to its
	// workers' (failpoints).
	ExtraEnv []string
	// Wrap, when set, rewrites the agent's command (e.g. to start it in a
	// cgroup).
	Wrap           func(*exec.Cmd) *exec.Cmd
	Stdout, Stderr io.Writer
	// Namespace, when set (InNamespace), is the network namespace the
	// node runs in.
	Namespace *netns.Node

	cmd    *exec.Cmd
	exited chan struct{}
}

// NodeOptions returns the configuration of node id under dir: this Env's
// etcd and the node's agent certificate (issued by Start), a fresh arena under /dev/shm, and one tiny decode
// instance; callers change what they need before Start.
func (e *Env) NodeOptions(id, dir string) agent.Options {
	return agent.Options{
		NodeID: id, DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(dir, "agent.sock"),
		Etcd: e.Endpoints, EtcdTLS: true, CertDir: e.IdentityDir(pki.Agent(id)),
		ArenaPath:  filepath.Join("/dev/shm", fmt.Sprintf("lifeline-%d-%d-%s", os.Getpid(), time.Now().UnixNano(), id)),
		ArenaSlots: 128, ArenaSlotBytes: 8192,
		Instances:    []agent.InstanceSpec{{Role: "decode", Preset: "tiny", Count: 1}},
		WorkerBinary: e.Binary,
	}
}

// NewNode returns a node that Start will run with opts; its configuration
// file goes next to the control socket.
func (e *Env) NewNode(opts agent.Options) *Node {
	return &Node{env: e, Options: opts, Config: filepath.Join(filepath.Dir(opts.Socket), "agent.json")}
}

// Start writes the configuration and starts the agent.
func (n *Node) Start() error {
	if id := pki.Agent(n.Options.NodeID); n.Options.CertDir == n.env.IdentityDir(id) {
		if _, err := n.env.Identity(id); err != nil {
			return fmt.Errorf("localcluster: agent %s: %w", n.Options.NodeID, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(n.Config), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(n.Options)
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.Config, b, 0o600); err != nil {
		return err
	}
	cmd := exec.Command(n.env.Binary, "agent", "--config", n.Config)
	// It stops (SIGTERM) when this process dies, even by SIGKILL: a
	// killed up or test leaves nothing running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if len(n.ExtraEnv) > 0 {
		cmd.Env = append(os.Environ(), n.ExtraEnv...)
	}
	if n.Wrap != nil {
		cmd = n.Wrap(cmd)
	}
	cmd.Stdout, cmd.Stderr = n.Stdout, n.Stderr
	// Workers inherit the agent's output and may outlive it (that is the
	// point of adoption): do not wait for them to close it.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("localcluster: start agent %s: %w", n.Options.NodeID, err)
	}
	exited := make(chan struct{})
	n.cmd, n.exited = cmd, exited
	go func() { cmd.Wait(); close(exited) }()
	return nil
}

// FreeMetricsPort makes sure the agent can bind its metrics address
// before it is started again: the port was free when it was picked, not
// reserved, and another process may have bound it since (the agent would
// exit at once, at every restart). A taken loopback port is replaced by a
// free one, and moved says so (what found it taken, the new address); ""
// when the address is kept. An address that is not loopback (a node in a
// network namespace) cannot be checked from here and is kept.
func (n *Node) FreeMetricsPort() (moved string, err error) {
	old := n.Options.Metrics
	host, _, serr := net.SplitHostPort(old)
	if serr != nil || !net.ParseIP(host).IsLoopback() {
		return "", nil
	}
	l, taken := net.Listen("tcp", old)
	if taken == nil {
		l.Close()
		return "", nil
	}
	addr, err := FreeLoopbackAddr()
	if err != nil {
		return "", fmt.Errorf("localcluster: agent %s: its metrics address %s is taken (%v), and no other is free: %w", n.Options.NodeID, old, taken, err)
	}
	n.Options.Metrics = addr
	return fmt.Sprintf("its metrics address %s is taken (%v); it serves them on %s now", old, taken, addr), nil
}

// Process is the running agent process (nil before Start).
func (n *Node) Process() *os.Process {
	if n.cmd == nil {
		return nil
	}
	return n.cmd.Process
}

// Exited is closed when the agent process started last has exited.
func (n *Node) Exited() <-chan struct{} { return n.exited }

// Stop sends SIGTERM (the agent stops its workers) and waits up to
// timeout before killing it.
func (n *Node) Stop(timeout time.Duration) {
	n.Signal(syscall.SIGTERM)
	n.Wait(timeout)
}

// Signal sends sig to the agent if it runs.
func (n *Node) Signal(sig os.Signal) {
	if n.cmd == nil {
		return
	}
	select {
	case <-n.exited:
	default:
		n.cmd.Process.Signal(sig)
	}
}

// Wait waits up to timeout for the agent to exit, then kills it.
func (n *Node) Wait(timeout time.Duration) {
	if n.cmd == nil {
		return
	}
	select {
	case <-n.exited:
	case <-time.After(timeout):
		n.cmd.Process.Kill()
		<-n.exited
	}
}

// RemoveArena removes the node's arena file (after Stop).
func (n *Node) RemoveArena() { os.Remove(n.Options.ArenaPath) }

// Workers asks the agent for its supervised workers.
func (n *Node) Workers(ctx context.Context) ([]controlapi.Worker, error) {
	return nodectl.Workers(ctx, n.Options.Socket)
}

// Status asks the agent for its status.
func (n *Node) Status(ctx context.Context) (controlapi.Status, error) {
	return nodectl.GetStatus(ctx, n.Options.Socket)
}

// KillWorker SIGKILLs the worker serving instance and says when.
func (n *Node) KillWorker(ctx context.Context, instance string) (time.Time, error) {
	ws, err := n.Workers(ctx)
	if err != nil {
		return time.Time{}, err
	}
	for _, w := range ws {
		if w.InstanceID == instance && w.PID > 0 {
			at := time.Now()
			return at, syscall.Kill(w.PID, syscall.SIGKILL)
		}
	}
	return time.Time{}, fmt.Errorf("localcluster: node %s runs no worker of %s", n.Options.NodeID, instance)
}

// Events asks the agent for its recent events.
func (n *Node) Events(ctx context.Context) ([]controlapi.Event, error) {
	return nodectl.Events(ctx, n.Options.Socket)
}

// ExitState says how the agent process started last ended ("" while it
// runs).
func (n *Node) ExitState() string {
	select {
	case <-n.exited:
		return n.cmd.ProcessState.String()
	default:
		return ""
	}
}
