package drill

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/internal/failpoint"
	"github.com/lifeline-llm/lifeline/internal/netns"
	"github.com/lifeline-llm/lifeline/rdma"
)

// LocalOptions configure a cluster StartLocal runs.
type LocalOptions struct {
	// Dir holds everything (certificates, etcd, the nodes' data); the
	// caller removes it.
	Dir string
	// Binary is the lifeline executable (default: this one).
	Binary string
	// Preset is the workers' model (tiny or small).
	Preset string
	// Threads bounds each worker's compute threads where the drill's
	// shape sets none (0: every CPU). The local cluster's workers share
	// this machine's CPUs.
	Threads int
	// StepInterval paces the workers' reference engine: a step at most
	// every StepInterval (0: as fast as it computes). The tiny preset
	// paced to a few milliseconds a step streams as slowly as small
	// computes, at a fraction of its CPU: a drill's faults land mid-stream
	// as they do on small.
	StepInterval time.Duration
	// Log receives every process's output (nil: Dir/lifeline.log).
	Log io.Writer
}

// StartLocal starts a cluster of shape s on this machine: an embedded
// etcd, one agent per node (decode instances, prefill instances from the
// last node backwards, canaries out of the way, quick restarts and
// drains), and the frontends; it returns once every frontend serves.
func StartLocal(ctx context.Context, s Shape, o LocalOptions) (_ *Cluster, err error) {
	if s.Nodes < 1 || s.Frontends < 1 || s.DecodePerNode < 1 {
		return nil, fmt.Errorf("drill: shape %v: a node, a decode instance and a frontend at least", s)
	}
	if o.Threads < 0 {
		return nil, fmt.Errorf("drill: threads %d: give 0 (every CPU) or more", o.Threads)
	}
	if o.Log == nil {
		f, err := os.OpenFile(filepath.Join(o.Dir, "lifeline.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, err
		}
		o.Log = f
		defer func() {
			if err != nil {
				f.Close()
			}
		}()
	}
	nt, err := localNet(&s)
	if err != nil {
		return nil, err
	}
	var etcdHosts []string
	if nt != nil {
		etcdHosts = []string{nt.HostIP.String()}
	}
	env, err := localcluster.NewEnvWith(o.Dir, o.Binary, "", localcluster.EnvOptions{EtcdMembers: s.EtcdMembers, EtcdLog: o.Log, EtcdHosts: etcdHosts})
	if err != nil {
		if nt != nil {
			nt.Close()
		}
		return nil, err
	}
	c := &Cluster{Model: o.Preset, Etcd: env.Client, Certs: env.Certs, Local: true, shape: s, env: env, namespaces: map[string]*netns.Node{}}
	if nt != nil {
		// Last of all: the nodes are stopped by then.
		c.closers = append(c.closers, func() { nt.Close() })
	}
	c.closers = append(c.closers, env.Close)
	if f, ok := o.Log.(*os.File); ok {
		c.closers = append(c.closers, func() { f.Close() })
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := c.startNodes(env, nt, s, o); err != nil {
		return nil, err
	}
	c.log = o.Log
	c.closers = append(c.closers, c.stopFrontends)
	for i := 0; i < s.Frontends; i++ {
		// Addresses of its own, fixed: a frontend started again (a
		// soak's) serves where its clients and scrapers look.
		listen, err := localcluster.FreeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		metrics, err := localcluster.FreeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		args := []string{listen, "--id", fmt.Sprintf("drill-frontend-%d", i), "--metrics-addr", metrics}
		f, err := env.StartFrontend(args[0], o.Log, args[1:]...)
		if err != nil {
			return nil, err
		}
		c.fmu.Lock()
		c.frontends, c.frontendArgs = append(c.frontends, f), append(c.frontendArgs, args)
		c.fmu.Unlock()
		c.URLs, c.MetricsURLs, c.Debugs = append(c.URLs, f.URL), append(c.MetricsURLs, f.MetricsURL), append(c.Debugs, f.Debug)
	}
	if err := c.WaitReady(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	return c, nil
}

// startNodes starts the agents of shape s (in nt's namespaces when nt is
// not nil); Close stops them.
func (c *Cluster) startNodes(env *localcluster.Env, nt *netns.Net, s Shape, o LocalOptions) (err error) {
	c.closers = append(c.closers, func() { stopNodes(c.nodes) })
	for i := 0; i < s.Nodes; i++ {
		no := localNodeOptions(env, s, o, i)
		// Each agent serves its metrics on a loopback port of its own.
		if no.Metrics, err = localcluster.FreeLoopbackAddr(); err != nil {
			return err
		}
		n := env.NewNode(no)
		n.Stdout, n.Stderr = o.Log, o.Log
		if s.CutTransfers && i == s.Nodes-1 {
			n.ExtraEnv = []string{fmt.Sprintf("%s=%s=sleep:%s", failpoint.EnvVar, rdma.FailSourceMidway, CutFor)}
		}
		if nt != nil {
			if err := env.InNamespace(n, nt.Nodes[i]); err != nil {
				return err
			}
			c.namespaces[n.Options.Socket] = nt.Nodes[i]
		}
		if err := n.Start(); err != nil {
			return err
		}
		c.nodes = append(c.nodes, n)
		c.Sockets = append(c.Sockets, n.Options.Socket)
		c.AgentMetricsURLs = append(c.AgentMetricsURLs, "http://"+n.Options.Metrics)
	}
	return nil
}

// localNet makes the nodes' network namespaces when s asks for them and
// this process may (root); otherwise it clears s.NetNS and returns nil.
func localNet(s *Shape) (*netns.Net, error) {
	if !s.NetNS || netns.Available() != nil {
		s.NetNS = false
		return nil, nil
	}
	netns.Reap()
	return netns.Create(s.Nodes)
}

// localNodeOptions is node i of shape s: its decode instances, its share
// of the prefill instances, an arena big enough for a drill's long
// prompts, canaries an hour apart (drills kill workers themselves) and
// quick restarts, drain settles and deadlines.
func localNodeOptions(env *localcluster.Env, s Shape, lo LocalOptions, i int) agent.Options {
	id := fmt.Sprintf("node-%d", i)
	o := env.NodeOptions(id, filepath.Join(env.Dir, id))
	o.ArenaPath = filepath.Join("/dev/shm", fmt.Sprintf("lifeline-drill-%d-%d-%s", os.Getpid(), time.Now().UnixNano(), id))
	o.ArenaSlots, o.ArenaSlotBytes = 512, 131072
	threads := cmp.Or(s.Threads, lo.Threads)
	pace := agent.Duration(lo.StepInterval)
	o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: lo.Preset, Count: s.DecodePerNode, MaxRunning: s.MaxRunning, MaxQueued: s.MaxQueued,
		Threads: threads, TP: s.TP, StepInterval: pace}}
	if np := s.Prefill/s.Nodes + b2i((s.Nodes-1-i) < s.Prefill%s.Nodes); np > 0 {
		o.Instances = append(o.Instances, agent.InstanceSpec{Role: "prefill", Preset: lo.Preset, Count: np, Threads: lo.Threads, StepInterval: pace})
	}
	o.LeaseTTL, o.CrashLoopLimit = agent.Duration(3*time.Second), 20
	if s.LeaseTTL > 0 {
		o.LeaseTTL = agent.Duration(s.LeaseTTL)
	}
	o.CanaryIdle, o.CanaryTimeout = agent.Duration(time.Hour), agent.Duration(5*time.Second)
	if s.CanaryIdle > 0 {
		o.CanaryIdle = agent.Duration(s.CanaryIdle)
	}
	o.RestartBackoff, o.RestartMax = agent.Duration(100*time.Millisecond), agent.Duration(time.Second)
	o.DrainSettle = agent.Duration(500 * time.Millisecond)
	o.DrainDeadline, o.DrainHardDeadline = agent.Duration(10*time.Second), agent.Duration(30*time.Second)
	return o
}

// stopNodes stops the agents (each stops its workers) and removes their
// arenas.
func stopNodes(nodes []*localcluster.Node) {
	for _, n := range nodes {
		n.Signal(syscall.SIGTERM)
	}
	for _, n := range nodes {
		n.Wait(90 * time.Second)
		n.RemoveArena()
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// stopFrontends stops a local cluster's frontends (SIGTERM, then SIGKILL
// after 20 s).
func (c *Cluster) stopFrontends() {
	c.fmu.Lock()
	fs := slices.Clone(c.frontends)
	c.fmu.Unlock()
	for _, f := range fs {
		f.Stop(20 * time.Second)
	}
}

// frontend is a local cluster's frontend i as it runs now.
func (c *Cluster) frontend(i int) *localcluster.Frontend {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	return c.frontends[i]
}

// relaunchFrontend starts local frontend i again, once its process
// exited, on its address and flags, and returns once it serves (a
// minute at most).
func (c *Cluster) relaunchFrontend(ctx context.Context, i int) error {
	old := c.frontend(i)
	select {
	case <-old.Exited():
	case <-ctx.Done():
		return ctx.Err()
	}
	c.fmu.Lock()
	args := c.frontendArgs[i]
	c.fmu.Unlock()
	f, err := c.env.LaunchFrontend(args[0], c.log, args[1:]...)
	if err != nil {
		return err
	}
	c.fmu.Lock()
	c.frontends[i] = f
	c.fmu.Unlock()
	select {
	case <-f.Ready():
		return nil
	case <-f.Exited():
		return fmt.Errorf("drill: frontend %d exited as it started again (%s)", i, f.ExitState())
	case <-time.After(time.Minute):
		return fmt.Errorf("drill: frontend %d did not serve within a minute of starting again", i)
	case <-ctx.Done():
		return ctx.Err()
	}
}
