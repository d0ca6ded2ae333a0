package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/tests/binaries"
)

// benchCluster is two node agents (b0, b1) with one small decode worker
// each, on an embedded etcd, all real processes of a freshly built binary.
type benchCluster struct {
	env       *localcluster.Env
	nodes     []*localcluster.Node
	frontends []*localcluster.Frontend
	regs      map[string]schema.Registration
}

// buildEnv builds the binaries into a fresh directory and starts an Env
// there.
func buildEnv(prefix string) (*localcluster.Env, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	bin, err := binaries.Build(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	env, err := localcluster.NewEnv(dir, bin, "")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return env, nil
}

// closeEnv stops env and removes its directory.
func closeEnv(env *localcluster.Env) {
	env.Close()
	os.RemoveAll(env.Dir)
}

// startBenchCluster starts the cluster; prefillOn names nodes that also
// run a small prefill instance.
func startBenchCluster(slots int, prefillOn ...int) (c *benchCluster, err error) {
	c = &benchCluster{regs: map[string]schema.Registration{}}
	if c.env, err = buildEnv("lifeline-fe-bench"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	for i := 0; i < 2; i++ {
		id := fmt.Sprintf("b%d", i)
		o := c.env.NodeOptions(id, c.env.Dir+"/node-"+fmt.Sprint(i))
		o.ArenaSlots, o.ArenaSlotBytes = slots, 131072
		o.CanaryIdle = agent.Duration(time.Hour)
		o.RestartBackoff, o.RestartMax = agent.Duration(20*time.Millisecond), agent.Duration(50*time.Millisecond)
		o.CrashLoopLimit = 1000
		o.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "small", Count: 1}}
		if slices.Contains(prefillOn, i) {
			o.Instances = append(o.Instances, agent.InstanceSpec{Role: "prefill", Preset: "small", Count: 1})
		}
		n := c.env.NewNode(o)
		if err := n.Start(); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	ids := []string{"b0-decode-small-0", "b1-decode-small-0"}
	for _, n := range prefillOn {
		ids = append(ids, fmt.Sprintf("b%d-prefill-small-0", n))
	}
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		r, err := c.env.WaitRegistration(ctx, id, 0)
		cancel()
		if err != nil {
			return nil, err
		}
		c.regs[id] = r
	}
	return c, nil
}

// frontend starts a frontend with extra flags and returns its URL.
func (c *benchCluster) frontend(extra ...string) (string, error) {
	f, err := c.env.StartFrontend("127.0.0.1:0", nil, extra...)
	if err != nil {
		return "", err
	}
	c.frontends = append(c.frontends, f)
	return f.URL, nil
}

// nodeOf is the node running instance ("b1-…" runs on node 1).
func (c *benchCluster) nodeOf(instance string) *localcluster.Node {
	if strings.HasPrefix(instance, "b1") {
		return c.nodes[1]
	}
	return c.nodes[0]
}

// kill SIGKILLs instance's worker and says when.
func (c *benchCluster) kill(instance string) time.Time {
	at, err := c.nodeOf(instance).KillWorker(context.Background(), instance)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
	}
	return at
}

func (c *benchCluster) close() {
	for _, f := range c.frontends {
		f.Stop(10 * time.Second)
	}
	for _, n := range c.nodes {
		n.Stop(20 * time.Second)
		n.RemoveArena()
	}
	closeEnv(c.env)
}
