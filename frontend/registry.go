package frontend

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/frontend/route"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// The registry watch keeps the router in line with etcd: instances'
// registrations, nodes' records, and failure announcements, which fail the
// streams on that instance at once. A registration that vanishes (its
// agent's lease expired, or the instance is not ready) only stops new
// requests from going there: the streams on it go on while its frames
// arrive. A registration wakes the requests waiting for its model.

// syncTimeout bounds one full read of the registry; syncRetry spaces
// attempts while etcd is unreachable; probeEvery is how often the watch
// checks that etcd answers.
const (
	syncTimeout = 5 * time.Second
	syncRetry   = 200 * time.Millisecond
	probeEvery  = time.Second
)

// firstSync reads the registry until it succeeds, for up to wait: a
// frontend serves only with a view of it.
func (s *Server) firstSync(ctx context.Context, wait time.Duration) (int64, error) {
	deadline := time.Now().Add(wait)
	for {
		rev, err := s.sync(ctx)
		if err == nil {
			return rev, nil
		}
		// An identity etcd does not know, or a chain from another CA,
		// does not heal by waiting: say what fixes it, at once.
		hint, permanent := pki.EtcdHint(err, s.opts.Etcd, s.opts.CertDir, pki.Frontend(s.opts.ID))
		if permanent || !time.Now().Before(deadline) {
			return 0, hint
		}
		if err := sleep(ctx, syncRetry); err != nil {
			return 0, err
		}
	}
}

// sync replaces the router's view with a full read and returns its revision.
func (s *Server) sync(ctx context.Context) (int64, error) {
	gctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	resp, err := s.etcd.Get(gctx, schema.InstancesPrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	nodes, err := s.etcd.Get(gctx, schema.NodesPrefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision))
	if err != nil {
		return 0, err
	}
	s.health.heard(time.Now(), true)
	var all []route.Instance
	var allNodes []route.Node
	for _, kv := range nodes.Kvs {
		if n, ok := decodeNode(kv.Value); ok {
			allNodes = append(allNodes, n)
		}
	}
	s.mu.Lock()
	for _, kv := range resp.Kvs {
		if in, addr, ok := decodeRegistration(kv.Value); ok {
			all = append(all, in)
			s.addrs[in.ID] = addr
		}
	}
	s.mu.Unlock()
	s.router.Replace(all)
	s.router.ReplaceNodes(allNodes)
	for _, in := range all {
		s.registered(in)
	}
	s.ack.apply(resp.Header.Revision)
	return resp.Header.Revision, nil
}

// watch follows the registry from rev until ctx ends; when a watch breaks
// it reads the registry afresh and watches on from there, keeping the last
// view while etcd is unreachable.
func (s *Server) watch(ctx context.Context, rev int64) {
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			var err error
			if rev, err = s.sync(ctx); err != nil {
				sleep(ctx, syncRetry)
				continue
			}
		}
		s.watchFrom(ctx, rev)
		s.health.broken()
	}
}

// watchFrom applies the registry's changes after rev until one of its
// watches breaks or ctx ends.
func (s *Server) watchFrom(ctx context.Context, rev int64) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	insts := s.etcd.Watch(wctx, schema.InstancesPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	fails := s.etcd.Watch(wctx, schema.FailuresPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	nodes := s.etcd.Watch(wctx, schema.NodesPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	// etcd says nothing on a quiet watch, nor when it is unreachable:
	// probe it, so that silence means it cannot be reached.
	probe := time.NewTicker(probeEvery)
	defer probe.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-probe.C:
			s.goes.Go(func() { s.probe(wctx) })
			continue
		case wr, ok := <-insts:
			if !ok || wr.Err() != nil {
				return
			}
			s.applyInstances(wr.Events)
			// Only this watch's revision: the instances' changes up to it
			// are in the view (the other watches may run ahead of it).
			s.ack.apply(wr.Header.Revision)
		case nr, ok := <-nodes:
			if !ok || nr.Err() != nil {
				return
			}
			s.applyNodes(nr.Events)
		case fr, ok := <-fails:
			if !ok || fr.Err() != nil {
				return
			}
			s.applyFailures(fr.Events)
		}
		s.heard()
	}
}

// probe makes one small linearizable read of the registry: an answer
// shows etcd reachable, with a leader.
func (s *Server) probe(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, probeEvery)
	defer cancel()
	if _, err := s.etcd.Get(pctx, schema.InstancesPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err == nil {
		s.heard()
	}
}

func (s *Server) applyInstances(evs []*clientv3.Event) {
	for _, ev := range evs {
		id := strings.TrimPrefix(string(ev.Kv.Key), schema.InstancesPrefix)
		if ev.Type == clientv3.EventTypeDelete {
			s.router.Deregister(id)
			s.notifyRuns(id, event{gone: true, instance: id})
			continue
		}
		if in, addr, ok := decodeRegistration(ev.Kv.Value); ok {
			s.mu.Lock()
			if s.router.Generation(in.ID) <= in.Generation {
				s.addrs[in.ID] = addr
			}
			s.mu.Unlock()
			if s.router.Update(in) {
				s.registered(in)
			}
		}
	}
}

// registered follows a registration the router took: connections to the
// instance's older generations are retired, and requests waiting for its
// model are woken.
func (s *Server) registered(in route.Instance) {
	s.pool.retire(in.ID, in.Generation)
	if in.Ready && !in.Draining {
		s.capacity.signal(in.Model)
	}
}

func (s *Server) applyNodes(evs []*clientv3.Event) {
	for _, ev := range evs {
		if ev.Type == clientv3.EventTypeDelete {
			s.router.RemoveNode(strings.TrimPrefix(string(ev.Kv.Key), schema.NodesPrefix))
		} else if n, ok := decodeNode(ev.Kv.Value); ok {
			s.router.UpdateNode(n)
		}
	}
}

func (s *Server) applyFailures(evs []*clientv3.Event) {
	for _, ev := range evs {
		if ev.Type == clientv3.EventTypePut {
			var f schema.Failure
			if json.Unmarshal(ev.Kv.Value, &f) == nil {
				s.instanceGone(f.InstanceID, f.Generation, "worker died: "+f.Reason)
			}
		}
	}
}

func decodeNode(b []byte) (route.Node, bool) {
	var r schema.NodeRecord
	if json.Unmarshal(b, &r) != nil || r.Node == "" {
		return route.Node{}, false
	}
	n := route.Node{Name: r.Node, KVAddr: r.KVAddr, Prefixes: make(map[string]bool, len(r.Prefixes)), Updated: time.Unix(0, r.UpdatedUnixNano)}
	for _, p := range r.Prefixes {
		n.Prefixes[p] = true
	}
	return n, true
}

func decodeRegistration(b []byte) (route.Instance, string, bool) {
	var r schema.Registration
	if json.Unmarshal(b, &r) != nil || r.InstanceID == "" {
		return route.Instance{}, "", false
	}
	return route.Instance{ID: r.InstanceID, Generation: r.Generation, Model: r.Model, ModelRevision: r.ModelRevision, NumericsID: r.NumericsID,
		Ready: r.Ready, Draining: r.Draining, Outstanding: r.Running + r.Queued, Role: r.Role, Node: r.Node, KVAddr: r.KVAddr, KVIdentity: r.KVIdentity,
		ContextLen: r.ContextLen, TokenizerHash: r.TokenizerHash, Capacity: r.Capacity, BatchCapacity: r.BatchCapacity,
		Continuation: r.Continuation}, r.Addr, true
}

// instanceGone removes an instance that was announced dead and fails
// every stream on it now, without waiting for the stream itself to notice.
// A failure names a generation: a late notice about an older generation
// never touches the newer one that replaced it.
func (s *Server) instanceGone(id string, gen uint64, reason string) {
	gen = s.router.Fail(id, gen, time.Now())
	s.pool.fail(id, gen)
	s.notifyRuns(id, event{failed: true, instance: id, gen: gen, reason: reason})
}

// revisionOf is instance id's registered model revision ("" if unknown).
func (s *Server) revisionOf(id string) string {
	in, _ := s.router.Instance(id)
	return in.ModelRevision
}

// notifyRuns sends e to every request on instance id.
func (s *Server) notifyRuns(id string, e event) {
	s.mu.Lock()
	var runs []*run
	for r := range s.active[id] {
		runs = append(runs, r)
	}
	s.mu.Unlock()
	for _, r := range runs {
		r.notify(e)
	}
}

// capacitySignal wakes the requests waiting for an instance of a model.
// A waiter takes the signal before it looks at the router, so that a
// registration between its look and its wait still wakes it.
type capacitySignal struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

// watch returns a channel closed when an instance of model registers
// ready.
func (c *capacitySignal) watch(model string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		c.ch = map[string]chan struct{}{}
	}
	ch, ok := c.ch[model]
	if !ok {
		ch = make(chan struct{})
		c.ch[model] = ch
	}
	return ch
}

// signal wakes the waiters for model.
func (c *capacitySignal) signal(model string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch, ok := c.ch[model]; ok {
		close(ch)
		delete(c.ch, model)
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
