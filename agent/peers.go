package agent

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// peerRewarm is how often the agent dials again what a peer's connections
// lost (a peer restarted, an idle timeout after a partition).
const peerRewarm = 2 * time.Second

// peers are the other nodes' transfer endpoints, from their node records:
// the agent keeps connections open to each, so that the pull a migration
// asks for starts at once rather than after four handshakes.
type peers struct {
	mu    sync.Mutex
	addrs map[string]string // node → its transfer endpoint
	// changed wakes the warming loop when a record came or changed.
	changed chan struct{}
}

func (p *peers) set(node, addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if addr == "" {
		delete(p.addrs, node)
		return
	}
	p.addrs[node] = addr
}

func (p *peers) list() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.addrs))
	for _, a := range p.addrs {
		out = append(out, a)
	}
	return out
}

// startPeers follows the node records and keeps the transfer transport's
// connections to every other node warm.
func (a *Agent) startPeers(ctx context.Context) {
	if a.quic == nil {
		return
	}
	a.peers = &peers{addrs: map[string]string{}, changed: make(chan struct{}, 1)}
	a.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lifeline_agent_kv_transfer_peers_warm",
		Help: "Other nodes' transfer endpoints this agent holds a connection to, dialled ahead of need from their node records.",
	}, func() float64 { return float64(a.warmPeers()) }))
	a.track(func() { a.followNodes(ctx) })
	a.track(func() {
		t := time.NewTicker(peerRewarm)
		defer t.Stop()
		for {
			a.warm(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-a.peers.changed:
			}
		}
	})
}

// warm dials every known peer's connections that are not up, each peer on
// its own goroutine so that one that does not answer delays no other.
func (a *Agent) warm(ctx context.Context) {
	var wg sync.WaitGroup
	for _, addr := range a.peers.list() {
		if a.quic.Warmed(addr) {
			continue
		}
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, peerRewarm)
			defer cancel()
			if err := a.quic.Warm(wctx, addr); err != nil && ctx.Err() == nil {
				a.log.Debug("KV transfer peer not reachable ahead of need", "addr", addr, "err", err)
			}
		})
	}
	wg.Wait()
}

func (a *Agent) warmPeers() int {
	n := 0
	for _, addr := range a.peers.list() {
		if a.quic.Warmed(addr) {
			n++
		}
	}
	return n
}

// followNodes reads the node records and then watches them, again from
// the start after any watch failure.
func (a *Agent) followNodes(ctx context.Context) {
	for ctx.Err() == nil {
		rev, err := a.readNodes(ctx)
		if err == nil {
			wctx, cancel := context.WithCancel(ctx)
			for resp := range a.etcd.Watch(wctx, schema.NodesPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
				if resp.Err() != nil {
					break
				}
				for _, ev := range resp.Events {
					a.nodeEvent(string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete)
				}
				select {
				case a.peers.changed <- struct{}{}:
				default:
				}
			}
			cancel()
		}
		select {
		case <-ctx.Done():
		case <-time.After(peerRewarm):
		}
	}
}

func (a *Agent) readNodes(ctx context.Context) (int64, error) {
	gctx, cancel := context.WithTimeout(ctx, peerRewarm)
	defer cancel()
	resp, err := a.etcd.Get(gctx, schema.NodesPrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	for _, kv := range resp.Kvs {
		a.nodeEvent(string(kv.Key), kv.Value, false)
	}
	return resp.Header.Revision, nil
}

func (a *Agent) nodeEvent(key string, value []byte, deleted bool) {
	node := strings.TrimPrefix(key, schema.NodesPrefix)
	if node == a.opts.NodeID {
		return
	}
	var r schema.NodeRecord
	if deleted || json.Unmarshal(value, &r) != nil {
		a.peers.set(node, "")
		return
	}
	a.peers.set(node, r.KVAddr)
}
