// Package clustertest runs local-cluster pieces from tests: an Env with
// the freshly built binaries, node agents configured with typed options,
// and frontends, all stopped by t.Cleanup; and the waits and queries
// process tests share.
package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// NewEnv starts certificates and an embedded etcd in a test directory.
func NewEnv(t testing.TB) *localcluster.Env {
	t.Helper()
	return NewEnvWith(t, localcluster.EnvOptions{})
}

// NewEnvWith is NewEnv shaped by o.
func NewEnvWith(t testing.TB, o localcluster.EnvOptions) *localcluster.Env {
	t.Helper()
	env, err := localcluster.NewEnvWith(t.TempDir(), proctest.Lifeline(t), "", o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	return env
}

// Node is a node agent started for a test.
type Node struct {
	*localcluster.Node
	Env *localcluster.Env
	// Dir is the node's directory (configuration, socket, data).
	Dir string
	// Log is the agent's (and its workers') stderr.
	Log *proctest.SyncBuffer
}

// Config is what a test may set of a node before it starts: the agent's
// options, variables added to its (and its workers') environment, and a
// wrapper of its command (e.g. to start it in a cgroup).
type Config struct {
	agent.Options
	ExtraEnv []string
	Wrap     func(*exec.Cmd) *exec.Cmd
}

// Option changes a node's Config.
type Option func(*Config)

// NewNode starts node "n1" on a fresh Env: one tiny decode instance, a
// 3 s lease and quick canaries, changed by each opt.
func NewNode(t testing.TB, opts ...Option) *Node {
	t.Helper()
	return StartNode(t, NewEnv(t), "n1", opts...)
}

// Peer starts another node on first's Env; its canaries idle for an hour
// unless an opt says otherwise.
func Peer(t testing.TB, first *Node, id string, opts ...Option) *Node {
	t.Helper()
	return StartNode(t, first.Env, id, append([]Option{func(c *Config) { c.CanaryIdle = agent.Duration(time.Hour) }}, opts...)...)
}

// StartNode starts node id on env: one tiny decode instance, a 3 s lease
// and quick canaries, changed by each opt.
func StartNode(t testing.TB, env *localcluster.Env, id string, opts ...Option) *Node {
	t.Helper()
	dir := t.TempDir()
	c := Config{Options: env.NodeOptions(id, dir)}
	c.LeaseTTL, c.CanaryIdle, c.CanaryTimeout = agent.Duration(3*time.Second), agent.Duration(time.Second), agent.Duration(time.Second)
	for _, opt := range opts {
		opt(&c)
	}
	for i := range c.Instances {
		if c.Instances[i].Threads == 0 {
			// Tests run several nodes' workers on a few CPUs: a worker
			// computing on every CPU would spin its helpers against the
			// others' (the same bits on any number of threads).
			c.Instances[i].Threads = 1
		}
	}
	n := &Node{Node: env.NewNode(c.Options), Env: env, Dir: dir}
	n.ExtraEnv, n.Wrap = c.ExtraEnv, c.Wrap
	t.Cleanup(n.RemoveArena)
	n.Restart(t)
	return n
}

// Restart starts the agent process again (after it exited) with the same
// configuration; a cleanup stops it.
func (n *Node) Restart(t testing.TB) {
	t.Helper()
	n.Log = &proctest.SyncBuffer{}
	n.Stderr = n.Log
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	exited := n.Exited()
	proc := n.Process()
	log := n.Log
	t.Cleanup(func() {
		select {
		case <-exited:
			return
		default:
			proc.Signal(syscall.SIGTERM)
		}
		// The agent drains, bounded by its hard deadline, then exits.
		select {
		case <-exited:
		case <-time.After(90 * time.Second):
			proc.Signal(syscall.SIGQUIT) // its goroutines' stacks, into its log
			time.Sleep(time.Second)
			proc.Kill()
			<-exited
			t.Errorf("agent %s did not exit within 90 s of SIGTERM; its log:\n%s", n.Options.NodeID, log.String())
		}
	})
}

// Nodectl runs the nodectl binary against the node and returns its output.
func (n *Node) Nodectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(proctest.Nodectl(t), append([]string{"--socket", n.Options.Socket}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nodectl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// NodectlTry runs nodectl and returns its output, or "" if it failed.
func (n *Node) NodectlTry(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(proctest.Nodectl(t), append([]string{"--socket", n.Options.Socket}, args...)...).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

// WaitRegistration waits (up to a minute) for a ready registration of
// instance at a generation above after; it fails at once if the agent
// exits.
func (n *Node) WaitRegistration(t testing.TB, instance string, after uint64) schema.Registration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		select {
		case <-n.Exited():
			cancel()
		case <-ctx.Done():
		}
	}()
	r, err := n.Env.WaitRegistration(ctx, instance, after)
	if err != nil {
		select {
		case <-n.Exited():
			t.Fatalf("agent exited; log:\n%s", n.Log.String())
		default:
		}
		t.Fatalf("%v; agent log:\n%s", err, n.Log.String())
	}
	return r
}

// DialWorker connects to instance's worker at its registered address and
// generation, as a frontend would; a cleanup closes the connection.
func (n *Node) DialWorker(t testing.TB, instance string) *workerclient.Client {
	t.Helper()
	reg := n.WaitRegistration(t, instance, 0)
	tlsConf, err := workerclient.ClientTLS(n.Env.Certs)
	if err != nil {
		t.Fatal(err)
	}
	c, err := workerclient.Dial(t.Context(), reg.Addr, tlsConf, instance, reg.Generation)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// WaitWorkerReady waits for the node's single worker to be ready.
func (n *Node) WaitWorkerReady(t testing.TB) controlapi.Worker {
	t.Helper()
	var w controlapi.Worker
	proctest.WaitFor(t, time.Minute, "the worker to be ready", func() (bool, string) {
		ws, err := n.Workers(context.Background())
		if err != nil || len(ws) != 1 {
			return false, fmt.Sprintf("%v %v\nagent log:\n%s", ws, err, n.Log.String())
		}
		w = ws[0]
		return w.Ready, fmt.Sprintf("%+v\nagent log:\n%s", w, n.Log.String())
	})
	return w
}

// NodectlWorkers is `nodectl workers --json`, through the real binary.
func (n *Node) NodectlWorkers(t testing.TB) []controlapi.Worker {
	t.Helper()
	var ws []controlapi.Worker
	if err := json.Unmarshal([]byte(n.Nodectl(t, "workers", "--json")), &ws); err != nil {
		t.Fatal(err)
	}
	return ws
}

// NodectlStatus is `nodectl status --json`, through the real binary.
func (n *Node) NodectlStatus(t testing.TB) controlapi.Status {
	t.Helper()
	var st controlapi.Status
	if err := json.Unmarshal([]byte(n.Nodectl(t, "status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// NoOrphans asserts that on every node, once requests are done, no arena
// slot is being allocated, written or sealed, no lease is held and no pull
// is in progress (waiting up to 10 s for in-flight cleanup).
func NoOrphans(t testing.TB, nodes ...*Node) {
	t.Helper()
	for _, n := range nodes {
		proctest.WaitFor(t, 10*time.Second, "node "+n.Options.NodeID+" to hold no orphans", func() (bool, string) {
			st := n.NodectlStatus(t)
			by, _ := st.Arena["by_state"].(map[string]any)
			leases, _ := st.Arena["leases"].(float64)
			bad := leases != 0 || st.KVTransfer.Stats.PullsInProgress != 0
			for _, s := range []string{"WRITING", "SEALED", "ALLOCATED"} {
				if v, _ := by[s].(float64); v != 0 {
					bad = true
				}
			}
			return !bad, fmt.Sprintf("arena %v, transfer %+v", st.Arena, st.KVTransfer.Stats)
		})
	}
}

// StartFrontend runs a frontend against the node's etcd and returns its
// URL; a cleanup stops it (and shows its log's tail if the test failed).
func StartFrontend(t testing.TB, n *Node, extra ...string) string {
	t.Helper()
	return StartFrontendProc(t, n, extra...).URL
}

// StartFrontendProc is StartFrontend that returns the process (to kill
// or stop it); a cleanup stops it unless it exited.
func StartFrontendProc(t testing.TB, n *Node, extra ...string) *localcluster.Frontend {
	t.Helper()
	var log proctest.SyncBuffer
	f, err := n.Env.StartFrontend("127.0.0.1:0", &log, extra...)
	if err != nil {
		t.Fatalf("%v; its log:\n%s", err, logTail(log.String()))
	}
	t.Cleanup(func() {
		f.Signal(syscall.SIGCONT)
		f.Stop(10 * time.Second)
		if strings.Contains(log.String(), FrontendLeak) {
			t.Errorf("frontend %s %v: goroutines outlived its shutdown", f.URL, extra)
		}
		if t.Failed() {
			t.Logf("frontend %s %v log:\n%s", f.URL, extra, logTail(log.String()))
		}
	})
	return f
}

// FrontendLeak is what a frontend's log says when goroutines it started
// outlived its shutdown (frontend.ErrGoroutinesOutlived): every frontend
// a test starts is checked for it once stopped.
const FrontendLeak = "goroutines outlived the shutdown"

// logTail is the last 8,000 bytes of a process's log.
func logTail(out string) string {
	if len(out) > 8000 {
		return "…" + out[len(out)-8000:]
	}
	return out
}

// Instances is a single instance spec of the tiny preset.
func Instances(role string, count int) []agent.InstanceSpec {
	return []agent.InstanceSpec{{Role: role, Preset: "tiny", Count: count}}
}

// CADir creates a fresh cluster CA with `lifeline certs init`.
func CADir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ca")
	if _, errOut, err := proctest.Run(t, "certs", "init", "--dir", dir); err != nil {
		t.Fatalf("certs init: %v %s", err, errOut)
	}
	return dir
}

// Issue issues a certificate of role and name from the CA in ca with
// `lifeline certs issue` and returns its directory.
func Issue(t testing.TB, ca, role, name string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), role)
	if _, errOut, err := proctest.Run(t, "certs", "issue", "--ca", ca, "--role", role, "--name", name, "--dir", dir); err != nil {
		t.Fatalf("certs issue: %v %s", err, errOut)
	}
	return dir
}

// CertDir creates a fresh CA and returns the directory of a frontend
// certificate ("frontend:client") it issued.
func CertDir(t testing.TB) string {
	t.Helper()
	return Issue(t, CADir(t), "frontend", "client")
}

// CollectFrames reads a worker stream to its end.
func CollectFrames(t testing.TB, s *workerclient.Stream) []*wire.Frame {
	t.Helper()
	var fs []*wire.Frame
	for {
		f, err := s.Next()
		if errors.Is(err, io.EOF) {
			return fs
		}
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
	}
}

// Generated is what a worker stream's frames generated: the ids and text
// of its token frames in order (not the finish frame, not the prefix
// replay), and the first error frame as an error.
func Generated(fs []*wire.Frame) (ids []int32, text string, err error) {
	var b strings.Builder
	for _, f := range fs {
		if f.Error != nil && err == nil {
			err = fmt.Errorf("%s: %s", f.Error.Code, f.Error.Message)
		}
		if f.FinishReason == "" && f.SequenceNo > 0 {
			ids = append(ids, f.TokenId)
			b.WriteString(f.Text)
		}
	}
	return ids, b.String(), err
}

// SmallDecode is a node of count small-preset decode instances, with
// arena slots big enough for their blocks and canaries that stay out of
// the way (an hour apart): what most frontend tests run on.
func SmallDecode(count int) Option {
	return func(c *Config) {
		c.CanaryIdle = agent.Duration(time.Hour)
		c.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "small", Count: count}}
		c.ArenaSlotBytes = 131072
	}
}

// PacedStep is PacedDecode's step interval: tiny at 200 tokens a second,
// about as fast as small computes one stream on a loaded 2-core machine.
const PacedStep = 5 * time.Millisecond

// PacedDecode is a node of count tiny-preset decode instances paced to a
// step every PacedStep, and canaries an hour apart: streams that last
// long enough for a test to cut them mid-way, as small's do, at a
// fiftieth of small's CPU per token. The bits are tiny's own; a test that
// checks small's numerics runs SmallDecode.
func PacedDecode(count int) Option { return PacedDecodeEvery(count, PacedStep) }

// PacedDecodeEvery is PacedDecode at a step every step: a stream that
// must outlast a frontend's death and a takeover runs slower.
func PacedDecodeEvery(count int, step time.Duration) Option {
	return func(c *Config) {
		c.CanaryIdle = agent.Duration(time.Hour)
		c.Instances = []agent.InstanceSpec{{Role: "decode", Preset: "tiny", Count: count, StepInterval: agent.Duration(step)}}
	}
}
