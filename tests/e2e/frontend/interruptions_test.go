package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/frontend/sse"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// streamed is what a client read of a stream: its tokens, the end
// chunk's migrations, its error event and how it was answered.
type streamed struct {
	status     int
	body       string // of a refusal
	retryAfter string
	toks       []clustertest.Token
	migrations float64
	errType    string
	done       bool // [DONE] seen
}

// streamAsync posts a streaming request and reads it in the background,
// counting the tokens read in seen; it never calls t.Fatal (it runs off
// the test's goroutine).
func streamAsync(url string, body map[string]any, seen *atomic.Int64) <-chan streamed {
	out := make(chan streamed, 1)
	go func() {
		var s streamed
		defer func() { out <- s }()
		b, _ := json.Marshal(body)
		resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			s.body = err.Error()
			return
		}
		defer resp.Body.Close()
		s.status, s.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
		if resp.StatusCode != http.StatusOK {
			raw, _ := io.ReadAll(resp.Body)
			s.body = string(raw)
			return
		}
		for rd := sse.NewReader(resp.Body); ; {
			ev, err := rd.Next()
			if err == io.EOF {
				s.done = true
				return
			}
			switch {
			case err != nil:
				return
			case ev.Error != nil:
				s.errType = ev.Error.Type
			case ev.Chunk != nil && ev.Chunk.Lifeline.SequenceNo > 0:
				l := ev.Chunk.Lifeline
				s.toks = append(s.toks, clustertest.Token{Seq: l.SequenceNo, TokenID: l.TokenID, Text: ev.Chunk.Content(), Instance: l.InstanceID})
				if seen != nil {
					seen.Store(int64(l.SequenceNo))
				}
			case ev.Chunk != nil:
				var raw struct{ Lifeline map[string]any }
				json.Unmarshal(ev.Data, &raw)
				s.migrations, _ = raw.Lifeline["migrations"].(float64)
			}
		}
	}()
	return out
}

// sameTokens fails t unless got is want: same tokens, contiguous
// sequence numbers.
func sameTokens(t *testing.T, name string, got, want []clustertest.Token) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d tokens, want %d", name, len(got), len(want))
	}
	for i := range got {
		if got[i].Seq != i+1 || got[i].TokenID != want[i].TokenID || got[i].Text != want[i].Text {
			t.Fatalf("%s: token %d = %+v, want %+v", name, i+1, got[i], want[i])
		}
	}
}

// startFrontend is clustertest.StartFrontend with the frontend's log
// kept, and shown if the test fails.
func startFrontend(t *testing.T, env *localcluster.Env, extra ...string) string {
	t.Helper()
	log := &proctest.SyncBuffer{}
	f, err := env.StartFrontend("127.0.0.1:0", log, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("frontend log:\n%s", log.String())
		}
	})
	return f.URL
}

// getJSON gets url and returns its status and body.
func getJSON(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// gauge reads one unlabelled metric of the frontend (-1 if absent).
func gauge(t *testing.T, url, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(clustertest.Metrics(t, url), "\n") {
		var v float64
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return -1
}

// leaseNode is a node with a 2 s lease and one tiny decode instance that
// steps every step (a worker whose KV lease lapses recomputes its
// sequences into private memory: small, on a loaded machine, fell silent
// long enough to be given up on); opts change it further.
func leaseNode(step time.Duration, opts ...clustertest.Option) []clustertest.Option {
	return append([]clustertest.Option{clustertest.PacedDecodeEvery(1, step), func(o *clustertest.Config) {
		o.LeaseTTL = agent.Duration(2 * time.Second)
	}}, opts...)
}

// outage is how a test takes the nodes' leases away (cut) and gives them
// back (restore); flowing says whether the workers' frames keep arriving
// meanwhile, without a migration. Both a frozen agent and one cut from
// etcd leave their workers decoding: the agent is not on the token path
// (a worker whose KV lease lapses recomputes into private memory).
type outage struct {
	cut, restore func()
	flowing      bool
}

// leaseOutage runs seeded streams through the frontend at url while the
// nodes lose their leases: the registrations vanish, yet the streams
// complete, bit-identical to fault-free runs (while their frames flow,
// without a migration, and going on during the outage); a
// request made meanwhile waits (or is refused, retryably); once the
// nodes register again, at higher generations, new requests are served,
// and the old generations' connections close with their last stream.
func leaseOutage(t *testing.T, url string, nodes []*clustertest.Node, o outage, maxTokens int) {
	gens := map[*clustertest.Node]uint64{}
	for _, n := range nodes {
		gens[n] = n.WaitRegistration(t, n.Options.NodeID+"-decode-tiny-0", 0).Generation
	}
	bodies := []map[string]any{
		{"model": "tiny", "prompt": "The lighthouse keeper", "max_tokens": maxTokens, "temperature": 0.9, "seed": 21, "stream": true, "ignore_eos": true},
		{"model": "tiny", "prompt": "In the valley below", "max_tokens": maxTokens, "temperature": 0, "seed": 22, "stream": true, "ignore_eos": true},
	}
	want := clustertest.StreamCompletions(t, url, bodies)
	seen := make([]atomic.Int64, len(bodies))
	var runs []<-chan streamed
	for i, b := range bodies {
		runs = append(runs, streamAsync(url, b, &seen[i]))
	}
	proctest.WaitFor(t, 30*time.Second, "both streams to be under way", func() (bool, string) {
		return seen[0].Load() >= 10 && seen[1].Load() >= 10, fmt.Sprint(seen[0].Load(), seen[1].Load())
	})
	o.cut()
	cut := time.Now()
	proctest.WaitFor(t, 15*time.Second, "the frontend to see every registration vanish", func() (bool, string) {
		code, body := getJSON(url + "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "no routable instance"), fmt.Sprint(code, body)
	})
	at := []int64{seen[0].Load(), seen[1].Load()}
	t.Logf("registrations gone %v after the cut, streams at %v", time.Since(cut).Round(time.Millisecond), at)
	if code, _ := getJSON(url + "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d during the outage", code)
	}
	during := streamAsync(url, map[string]any{"model": "tiny", "prompt": "Meanwhile", "max_tokens": 8, "seed": 3, "stream": true, "ignore_eos": true}, nil)
	if o.flowing {
		proctest.WaitFor(t, 15*time.Second, "the streams to go on while no instance is registered", func() (bool, string) {
			ok := true
			for i := range bodies {
				ok = ok && (seen[i].Load() >= at[i]+50 || int(seen[i].Load()) == len(want[i]))
			}
			return ok, fmt.Sprint(seen[0].Load(), seen[1].Load())
		})
	}
	proctest.Never(t, time.Second, "the request made during the outage answered while nothing is registered", func() (bool, string) {
		select {
		case d := <-during:
			return true, fmt.Sprintf("%+v", d)
		default:
			return false, ""
		}
	})
	o.restore()
	t.Logf("leases restored %v after the cut; streams at %d, %d", time.Since(cut).Round(time.Millisecond), seen[0].Load(), seen[1].Load())
	for _, n := range nodes {
		r := n.WaitRegistration(t, n.Options.NodeID+"-decode-tiny-0", gens[n])
		t.Logf("%s registered again at generation %d (was %d)", r.InstanceID, r.Generation, gens[n])
	}
	for i, run := range runs {
		got := <-run
		t.Logf("stream %d: %d tokens, %v migrations", i, len(got.toks), got.migrations)
		if got.status != http.StatusOK || got.errType != "" || !got.done || (o.flowing && got.migrations != 0) {
			t.Fatalf("stream %d: status %d %s, error %q, done %v, %v migrations", i, got.status, got.body, got.errType, got.done, got.migrations)
		}
		sameTokens(t, fmt.Sprint("stream ", i), got.toks, want[i])
	}
	switch d := <-during; {
	case d.status == http.StatusOK && d.done && len(d.toks) == 8:
		t.Logf("the request made during the outage waited and was served")
	case d.status == http.StatusServiceUnavailable && d.retryAfter != "" && strings.Contains(d.body, `"type":"no_capacity"`):
		t.Logf("the request made during the outage was refused, retryably")
	default:
		t.Fatalf("request during the outage: %+v", d)
	}
	after, _ := clustertest.StreamCompletion(t, url, map[string]any{"model": "tiny", "prompt": "Afterwards", "max_tokens": 8, "stream": true, "ignore_eos": true}, nil)
	if len(after) != 8 {
		t.Fatalf("after the outage: %d tokens", len(after))
	}
	if code, body := getJSON(url + "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz after the outage: %d %s", code, body)
	}
	proctest.WaitFor(t, 10*time.Second, "the old generations' connections to close", func() (bool, string) {
		n := gauge(t, url, "lifeline_frontend_worker_connections")
		return n >= 0 && n <= float64(len(nodes)), fmt.Sprint(n)
	})
}

// TestFrontendLeaseExpiryKeepsStreams: every agent is frozen (SIGSTOP;
// its worker, another process, is left running) past its 2 s lease while
// its worker streams; the frontend sees the registrations vanish and
// keeps the streams, which go on flowing without a migration and complete
// bit-identical; the agents, resumed, register again.
func TestFrontendLeaseExpiryKeepsStreams(t *testing.T) {
	t.Parallel()
	// 480 tokens a step every 20 ms: ~10 s, past the outage.
	n1 := clustertest.NewNode(t, leaseNode(20*time.Millisecond)...)
	n2 := clustertest.Peer(t, n1, "n2", leaseNode(20*time.Millisecond)...)
	nodes := []*clustertest.Node{n1, n2}
	url := startFrontend(t, n1.Env)
	signal := func(sig syscall.Signal) func() {
		return func() {
			for _, n := range nodes {
				n.Process().Signal(sig)
			}
		}
	}
	for _, n := range nodes {
		p := n.Process()
		t.Cleanup(func() { p.Signal(syscall.SIGCONT) }) // before the node's own cleanup stops it
	}
	leaseOutage(t, url, nodes, outage{cut: signal(syscall.SIGSTOP), restore: signal(syscall.SIGCONT), flowing: true}, 480)
}

// etcdCut is a TCP proxy in front of etcd whose connections can be cut:
// an agent that reaches etcd through it loses etcd, and so its lease,
// while the frontend keeps its own connection.
type etcdCut struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

func newEtcdCut(t *testing.T, target string) *etcdCut {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &etcdCut{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	return p
}

func (p *etcdCut) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		go func() { io.Copy(up, c); up.Close() }()
		go func() { io.Copy(c, up); c.Close() }()
	}
}

// setCut cuts every connection and refuses new ones (true), or lets them
// through again (false).
func (p *etcdCut) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		p.conns = map[net.Conn]bool{}
	}
}

// TestFrontendEtcdPartitionKeepsStreams: every agent is cut from etcd
// (the frontend is not) past its 2 s lease while its worker streams. The
// registrations vanish and the frontend routes nothing new there, but
// the streams' frames keep arriving and the streams go on, without a
// migration, and complete bit-identical; a request made meanwhile waits
// until the agents, reconnected, register again at higher generations.
func TestFrontendEtcdPartitionKeepsStreams(t *testing.T) {
	t.Parallel() // waits on timers and processes: overlapped with the other waiting tests
	env := clustertest.NewEnv(t)
	proxy := newEtcdCut(t, env.Etcd.Endpoint)
	viaProxy := func(o *clustertest.Config) { o.Etcd = []string{proxy.ln.Addr().String()} }
	// 480 tokens a step every 30 ms: ~14 s, past the outage (a cut
	// agent takes longer to give its lease up than a frozen one).
	n1 := clustertest.StartNode(t, env, "n1", leaseNode(30*time.Millisecond, viaProxy)...)
	n2 := clustertest.StartNode(t, env, "n2", leaseNode(30*time.Millisecond, viaProxy)...)
	url := startFrontend(t, n1.Env)
	leaseOutage(t, url, []*clustertest.Node{n1, n2}, outage{cut: func() { proxy.setCut(true) }, restore: func() { proxy.setCut(false) }, flowing: true}, 480)
}
