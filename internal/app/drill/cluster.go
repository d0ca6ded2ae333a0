package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/internal/app/overload"
	"github.com/lifeline-llm/lifeline/internal/netns"
	"github.com/lifeline-llm/lifeline/internal/procfs"
	"github.com/lifeline-llm/lifeline/internal/tracing"
)

// Cluster is what drills act on: frontends by URL, node agents by control
// socket, and optionally etcd and the cluster's certificates (to watch
// registrations and ask workers for their health).
type Cluster struct {
	// URLs are the frontends; MetricsURLs their metrics listeners (the
	// API port serves no metrics), in the same order.
	URLs        []string
	MetricsURLs []string
	// Debugs are the frontends' debug sockets' bases ("unix:PATH",
	// debugsock: traces, goroutines), in the same order; known for a
	// local cluster, or given.
	Debugs []string
	// Sockets are the node agents' control sockets; AgentMetricsURLs
	// their metrics listeners (known for a local cluster only).
	Sockets          []string
	AgentMetricsURLs []string
	// Model is the model every load asks for.
	Model string
	// Etcd, when not nil, is a client of the cluster's etcd.
	Etcd *clientv3.Client
	// Certs, when set, is the cluster's certificate directory: drills may
	// then dial workers for their health.
	Certs string
	// Local is true for a cluster this package started (and will stop).
	Local bool

	// shape is what a local cluster was started as, env its certificates
	// and embedded etcd.
	shape   Shape
	env     *localcluster.Env
	closers []func()
	// namespaces are the nodes' network namespaces by control socket
	// (Shape.NetNS).
	namespaces map[string]*netns.Node
	// nodes are a local cluster's agents, in socket order; frontends its
	// frontends and frontendArgs what each was started with (its address
	// and flags), in URL order: a soak kills them and starts them again.
	nodes        []*localcluster.Node
	fmu          sync.Mutex
	frontends    []*localcluster.Frontend
	frontendArgs [][]string
	log          io.Writer
}

// Close releases what the cluster holds (a local cluster stops).
func (c *Cluster) Close() {
	for i := len(c.closers) - 1; i >= 0; i-- {
		c.closers[i]()
	}
	c.closers = nil
}

// Worker is a supervised worker and the node whose agent runs it.
type Worker struct {
	controlapi.Worker
	Socket string
	Node   string
}

// Workers lists every node's workers.
func (c *Cluster) Workers(ctx context.Context) ([]Worker, error) {
	var out []Worker
	for _, s := range c.Sockets {
		st, err := nodectl.GetStatus(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("drill: agent %s: %w", s, err)
		}
		for _, w := range st.Instances {
			out = append(out, Worker{Worker: w, Socket: s, Node: st.NodeID})
		}
	}
	return out, nil
}

// Statuses is every node's status, in socket order.
func (c *Cluster) Statuses(ctx context.Context) ([]controlapi.Status, error) {
	out := make([]controlapi.Status, len(c.Sockets))
	for i, s := range c.Sockets {
		st, err := nodectl.GetStatus(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("drill: agent %s: %w", s, err)
		}
		out[i] = st
	}
	return out, nil
}

// Shape counts what the cluster runs.
func (c *Cluster) Shape(ctx context.Context) (Shape, error) {
	ws, err := c.Workers(ctx)
	if err != nil {
		return Shape{}, err
	}
	s := Shape{Nodes: len(c.Sockets), Frontends: len(c.URLs)}
	decode := map[string]int{}
	for _, w := range ws {
		switch w.Role {
		case "decode":
			decode[w.Node]++
		case "prefill":
			s.Prefill++
		}
	}
	s.DecodePerNode = -1
	for _, n := range decode {
		if s.DecodePerNode < 0 || n < s.DecodePerNode {
			s.DecodePerNode = n
		}
	}
	if len(decode) < s.Nodes {
		s.DecodePerNode = 0
	}
	return s, nil
}

// Lacks says what of need the cluster does not have ("" when it has it).
func (s Shape) Lacks(need Shape) string {
	switch {
	case s.Nodes < need.Nodes:
		return fmt.Sprintf("needs %d nodes, the cluster has %d", need.Nodes, s.Nodes)
	case s.DecodePerNode < need.DecodePerNode:
		return fmt.Sprintf("needs %d decode instance(s) on every node", need.DecodePerNode)
	case s.Prefill < need.Prefill:
		return fmt.Sprintf("needs %d prefill instances, the cluster has %d", need.Prefill, s.Prefill)
	case s.Frontends < need.Frontends:
		return fmt.Sprintf("needs %d frontends, %d given", need.Frontends, s.Frontends)
	}
	return ""
}

// WaitReady waits until every supervised worker is ready and every
// frontend serves a one-token completion: the state every drill starts
// from.
func (c *Cluster) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		ws, err := c.Workers(ctx)
		ready := err == nil && len(ws) > 0
		for _, w := range ws {
			if !w.Ready {
				ready, last = false, fmt.Sprintf("%s on %s: %s %s", w.InstanceID, w.Node, w.State, w.NotReady)
			}
		}
		if err != nil {
			last = err.Error()
		}
		if ready {
			if last = c.servable(ctx); last == "" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drill: the cluster is not ready within %v (last: %s)", timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// servable says why a frontend does not serve a one-token completion yet.
func (c *Cluster) servable(ctx context.Context) string {
	body := fmt.Sprintf(`{"model":%q,"prompt":"ready","max_tokens":1,"temperature":0}`, c.Model)
	for _, u := range c.URLs {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Sprintf("%s answers %d", u, resp.StatusCode)
		}
	}
	return ""
}

// Kill is a worker SIGKILLed by a drill.
type Kill struct {
	Worker
	At time.Time
	// Rev is etcd's revision just before the kill (0 without etcd).
	Rev int64
}

// KillWorker SIGKILLs the worker of instance (its agent gives the pid: the
// agent must run on this host).
func (c *Cluster) KillWorker(ctx context.Context, instance string) (Kill, error) {
	ws, err := c.Workers(ctx)
	if err != nil {
		return Kill{}, err
	}
	for _, w := range ws {
		if w.InstanceID == instance && w.PID > 0 {
			var rev int64
			if c.Etcd != nil {
				resp, err := c.Etcd.Get(ctx, schema.InstancesPrefix+instance)
				if err != nil {
					return Kill{}, fmt.Errorf("drill: etcd: %w", err)
				}
				rev = resp.Header.Revision
			}
			at := time.Now()
			if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil {
				return Kill{}, fmt.Errorf("drill: kill %s (pid %d): %w", instance, w.PID, err)
			}
			return Kill{Worker: w, At: at, Rev: rev}, nil
		}
	}
	return Kill{}, fmt.Errorf("drill: no agent runs a worker of %s", instance)
}

// Detected waits for the agent's exit event of k's worker and returns
// when the agent detected it.
func (c *Cluster) Detected(ctx context.Context, k Kill, timeout time.Duration) (controlapi.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		evs, err := nodectl.Events(ctx, k.Socket)
		for _, e := range evs {
			if e.Kind == controlapi.EventExit && e.InstanceID == k.InstanceID && e.Generation == k.Generation {
				if e.DetectedAt.IsZero() {
					e.DetectedAt = e.Time
				}
				return e, nil
			}
		}
		select {
		case <-ctx.Done():
			return controlapi.Event{}, fmt.Errorf("drill: no exit event of %s generation %d within %v (%v)", k.InstanceID, k.Generation, timeout, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Removed waits until k's instance at its generation is out of routing:
// with etcd, its registration deleted, not ready or replaced (deregistered)
// and every frontend's acknowledged routing view past that change
// (removed); without etcd, both are when the agent stops calling it
// ready.
func (c *Cluster) Removed(ctx context.Context, k Kill, timeout time.Duration) (deregistered, removed time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if c.Etcd == nil {
		for {
			ws, err := nodectl.Workers(ctx, k.Socket)
			for _, w := range ws {
				if w.InstanceID == k.InstanceID && (!w.Ready || w.Generation != k.Generation) {
					now := time.Now()
					return now, now, nil
				}
			}
			select {
			case <-ctx.Done():
				return time.Time{}, time.Time{}, fmt.Errorf("drill: %s generation %d still ready after %v (%v)", k.InstanceID, k.Generation, timeout, err)
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
	rev, err := c.deregistration(ctx, k)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	deregistered = time.Now()
	for {
		resp, err := c.Etcd.Get(ctx, schema.FrontendsPrefix, clientv3.WithPrefix())
		behind := err != nil
		for _, kv := range kvsOf(resp) {
			var f schema.FrontendRecord
			if json.Unmarshal(kv.Value, &f) != nil || f.AppliedRevision < rev {
				behind = true
			}
		}
		if !behind {
			return deregistered, time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return deregistered, time.Time{}, fmt.Errorf("drill: the frontends did not acknowledge revision %d (%s leaving) within %v", rev, k.InstanceID, timeout)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// deregistration watches k's registration from just before the kill and
// returns the revision of the change that made it unroutable.
func (c *Cluster) deregistration(ctx context.Context, k Kill) (int64, error) {
	for ev := range c.Etcd.Watch(ctx, schema.InstancesPrefix+k.InstanceID, clientv3.WithRev(k.Rev+1)) {
		if err := ev.Err(); err != nil {
			return 0, fmt.Errorf("drill: watch %s: %w", k.InstanceID, err)
		}
		for _, e := range ev.Events {
			var reg schema.Registration
			if e.Type == clientv3.EventTypeDelete || json.Unmarshal(e.Kv.Value, &reg) != nil || !reg.Ready || reg.Generation != k.Generation {
				return e.Kv.ModRevision, nil
			}
		}
	}
	return 0, fmt.Errorf("drill: %s generation %d still registered ready: %w", k.InstanceID, k.Generation, ctx.Err())
}

// WaitBack waits until instance is ready at a generation above gen.
func (c *Cluster) WaitBack(ctx context.Context, instance string, gen uint64, timeout time.Duration) (Worker, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ws, err := c.Workers(ctx)
		for _, w := range ws {
			if w.InstanceID == instance && w.Ready && w.Generation > gen {
				return w, nil
			}
		}
		select {
		case <-ctx.Done():
			return Worker{}, fmt.Errorf("drill: %s not ready above generation %d within %v (%v)", instance, gen, timeout, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Freeze is an agent a drill stopped with SIGSTOP.
type Freeze struct {
	Socket string
	Node   string
	PID    int
	At     time.Time

	thawed bool
}

// FreezeAgent SIGSTOPs the agent of socket (it must run on this host):
// its control socket, lease renewals, KV service and transfers stop
// answering, its workers keep running. Thaw it, also on every error path.
func (c *Cluster) FreezeAgent(ctx context.Context, socket string) (*Freeze, error) {
	st, err := nodectl.GetStatus(ctx, socket)
	if err != nil {
		return nil, fmt.Errorf("drill: agent %s: %w", socket, err)
	}
	if st.PID <= 0 {
		return nil, fmt.Errorf("drill: agent %s gives no pid", socket)
	}
	f := &Freeze{Socket: socket, Node: st.NodeID, PID: st.PID, At: time.Now()}
	if err := syscall.Kill(st.PID, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("drill: SIGSTOP agent %s (pid %d): %w", st.NodeID, st.PID, err)
	}
	// The fault is in place once every thread has stopped (one in the
	// middle of a long system call stops when it returns).
	deadline := time.Now().Add(2 * time.Second)
	for {
		stopped, state := f.Stopped()
		if stopped {
			return f, nil
		}
		if time.Now().After(deadline) {
			f.Thaw()
			return nil, fmt.Errorf("drill: agent %s (pid %d) not stopped 2 s after SIGSTOP: %s", st.NodeID, st.PID, state)
		}
		time.Sleep(time.Millisecond)
	}
}

// Stopped reports whether every thread of the frozen agent is stopped,
// and otherwise the first that is not, with its state.
func (f *Freeze) Stopped() (bool, string) {
	tids, err := procfs.Tasks(f.PID)
	if err != nil {
		return false, err.Error()
	}
	for _, tid := range tids {
		state, err := procfs.TaskState(f.PID, tid)
		if err != nil {
			continue // the thread exited
		}
		if state != 'T' && state != 't' {
			return false, fmt.Sprintf("thread %d in state %c", tid, state)
		}
	}
	return true, ""
}

// Thaw resumes a frozen agent (once; later calls do nothing) and returns
// when.
func (f *Freeze) Thaw() (time.Time, error) {
	if f.thawed {
		return time.Time{}, nil
	}
	f.thawed = true
	at := time.Now()
	if err := syscall.Kill(f.PID, syscall.SIGCONT); err != nil {
		return at, fmt.Errorf("drill: SIGCONT agent %s (pid %d): %w", f.Node, f.PID, err)
	}
	return at, nil
}

// ErrNoCerts is returned by WorkerHealth without the cluster's
// certificates.
var ErrNoCerts = errors.New("drill: no certificates (--certs): workers cannot be asked for their health")

// WorkerHealth asks a worker for its health (in flight, requests started,
// running, queued…) over the worker protocol.
func (c *Cluster) WorkerHealth(ctx context.Context, w Worker) (*wire.HealthReply, error) {
	if c.Certs == "" {
		return nil, ErrNoCerts
	}
	tlsConf, err := workerclient.ClientTLS(c.Certs)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	wc, err := workerclient.Dial(ctx, w.Addr, tlsConf, w.InstanceID, w.Generation)
	if err != nil {
		return nil, fmt.Errorf("drill: dial %s: %w", w.InstanceID, err)
	}
	defer wc.Close()
	h, err := wc.Health(ctx)
	if err != nil {
		return nil, fmt.Errorf("drill: health of %s: %w", w.InstanceID, err)
	}
	return h, nil
}

// Metrics are a frontend's Prometheus series by their full name (labels
// included), summed over every frontend.
type Metrics map[string]float64

// Sum adds every series of metric name (any labels).
func (m Metrics) Sum(name string) float64 {
	var s float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			s += v
		}
	}
	return s
}

// Metrics reads every frontend's /metrics and sums them by series.
func (c *Cluster) Metrics(ctx context.Context) (Metrics, error) {
	m := Metrics{}
	if len(c.MetricsURLs) != len(c.URLs) {
		return nil, fmt.Errorf("drill: the frontends' metrics addresses are not known (--frontend-metrics)")
	}
	for _, u := range c.MetricsURLs {
		page, err := scrape(ctx, u)
		if err != nil {
			return nil, err
		}
		for series, v := range page {
			m[series] += v
		}
	}
	return m, nil
}

// scrape reads one metrics page.
func scrape(ctx context.Context, u string) (Metrics, error) {
	m, err := overload.Scrape(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("drill: %w", err)
	}
	return Metrics(m), nil
}

// requestTrace is request id's spans, from the first frontend that
// traced it (nil when none did).
func (c *Cluster) requestTrace(ctx context.Context, id string) []tracing.Span {
	for _, u := range c.Debugs {
		if spans, err := tracing.Fetch(ctx, u, "request_id", id); err == nil && len(spans) > 0 {
			return spans
		}
	}
	return nil
}

// Traces records, for the report, the frontends' spans of up to n of
// streams' requests whose trace has a span named span that ended with an
// error (the fault hit them: "lifeline.decode" for a kill, …); a frontend
// without traces is skipped. It returns what it recorded.
func (c *Cluster) Traces(ctx context.Context, r *Recorder, streams []*Stream, n int, span string) (got [][]tracing.Span) {
	for _, s := range streams {
		if n == 0 {
			return got
		}
		if s.Result.RequestID == "" {
			continue
		}
		spans := c.requestTrace(ctx, s.Result.RequestID)
		if slices.ContainsFunc(spans, func(sp tracing.Span) bool { return sp.Name == span && sp.Error != "" }) {
			r.Trace(spans)
			got = append(got, spans)
			n--
		}
	}
	return got
}

// Delta is after − before of metric name.
func Delta(before, after Metrics, name string) float64 { return after.Sum(name) - before.Sum(name) }

func kvsOf(resp *clientv3.GetResponse) []*mvccpb.KeyValue {
	if resp == nil {
		return nil
	}
	return resp.Kvs
}
