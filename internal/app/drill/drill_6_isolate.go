package drill

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/netns"
)

func init() {
	Register(Drill{Number: 6, Name: seedNames[6][0], Expect: seedNames[6][1], Shape: Standard,
		NeedsEtcd: "the isolated agent answers nothing, so its lease expiry is seen in etcd", Run: runIsolate})
}

// runIsolate cuts the last node off from discovery by freezing its agent
// (SIGSTOP: no lease renewal, no answer on its socket) while a steady
// load runs. Its workers keep running and keep the streams they serve
// (the data plane does not depend on etcd). Once the node's lease expires
// its registrations vanish and every frontend's routing view drops them:
// from then on no new request may reach its decode workers (their own
// count of requests started does not move). The freeze holds until as
// many streams as the load runs at once started and ended after the
// removal; then the agent resumes and must re-register its instances at
// higher generations. Every stream of the load is bit-identical to its
// reference, with no gap or duplicate.
//
// In a local cluster whose nodes run in network namespaces of their own
// (Shape.NetNS, as root) the node is cut off for real instead: its link
// goes down, so its agent reaches neither etcd nor its peers and its
// workers reach no frontend. The streams it served then move (they are
// silent past the lease: the frontends migrate them) and nothing can
// start there; the rest is checked as above.
func runIsolate(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	socket := c.Sockets[len(c.Sockets)-1]
	victims, err := c.decodeWorkersOf(ctx, socket)
	if err != nil {
		return err
	}
	// Streams long enough that one a victim has just begun is still under
	// way when its link goes down (cutting it takes a few commands, which
	// can take a few hundred milliseconds on a loaded machine): the
	// engine's speed must not decide whether anything moves. 16 tokens
	// were not: on tiny paced to 5 ms a step (200 tokens/s) the stream
	// ended before the cut, and nothing moved.
	l := NewLoad(c, LoadSpec{Streams: cfg.Streams, MaxTokens: max(cfg.MaxTokens, 96), Seed: cfg.Seed, Tag: "6"})
	defer l.Close()
	if err := l.Reference(ctx); err != nil {
		return err
	}
	before, err := c.Metrics(ctx)
	if err != nil {
		return err
	}
	resp, err := c.Etcd.Get(ctx, schema.InstancesPrefix+victims[0].InstanceID)
	if err != nil {
		return fmt.Errorf("drill: etcd: %w", err)
	}
	ttl := c.leaseTTL(ctx, resp)
	iso, streams, err := c.isolate(ctx, l, r, socket, victims, resp.Header.Revision)
	if err != nil {
		return err
	}
	afterM, err := c.Metrics(ctx)
	if err != nil {
		return err
	}
	later, reachedStreams, kept := isolatedStreams(streams, victims, iso)
	reached := iso.startedAtThaw - iso.startedAtRemoval
	o := l.Compare(streams)
	Latencies(r, streams)
	figuresOf(r, o)
	r.Figure("lease_ttl_ms", float64(ttl.Milliseconds()))
	r.Figure("deregistered_ms", ms(iso.deregAt.Sub(iso.at)))
	r.Figure("removed_ms", ms(iso.removed.Sub(iso.at)))
	r.Figure("isolated_ms", ms(iso.thawAt.Sub(iso.at)))
	r.Figure("back_ms", ms(iso.backAt.Sub(iso.thawAt)))
	r.Figure("streams_while_isolated", float64(later))
	r.Figure("partitioned", b2f(iso.cut.partition()))
	if iso.cut.partition() {
		r.Figure("moved_off_cut_node", float64(movedOff(streams, victims, iso)))
	} else {
		r.Figure("kept_through_freeze", float64(kept))
	}
	r.Figure("reached_isolated_worker", float64(reached)+float64(reachedStreams))
	r.Figure("routed_to_not_ready", Delta(before, afterM, "lifeline_frontend_routed_to_not_ready_total"))
	var ck Check
	ck.That(later > 0, "no stream started while the node was isolated")
	ck.That(reached == 0 && reachedStreams == 0, "%d requests started on the isolated workers after their removal (%d streams)", reached, reachedStreams)
	ck.That(o.Failed == 0, "%d streams failed (%v)", o.Failed, o.FirstError)
	ck.That(o.Gaps == 0 && o.Duplicates == 0, "%d gaps, %d duplicates", o.Gaps, o.Duplicates)
	ck.That(o.Identical == o.Streams, "%d of %d streams bit-identical", o.Identical, o.Streams)
	ck.Verdict(r, fmt.Sprintf("%s isolated (%s): out of routing %.0f ms after it; none of %d streams started meanwhile reached it; back at %v",
		iso.cut.node(), iso.cut.kind(), ms(iso.removed.Sub(iso.at)), later, iso.backGen))
	return nil
}

// cutoff is how a node is isolated: its agent frozen, or its link down.
type cutoff interface {
	// lift ends the isolation (once) and says when.
	lift() (time.Time, error)
	node() string
	kind() string
	// partition is true for a cut link: the node's workers cannot be
	// asked anything while it lasts.
	partition() bool
}

func (f *Freeze) lift() (time.Time, error) { return f.Thaw() }
func (f *Freeze) node() string             { return f.Node }
func (f *Freeze) kind() string             { return "agent SIGSTOPped" }
func (f *Freeze) partition() bool          { return false }

// Partition is a node whose link a drill took down.
type Partition struct {
	Node string
	At   time.Time
	ns   *netns.Node
	done bool
}

// CutNode takes the link of socket's node down (its network namespace's
// veth): every packet between it and etcd, the frontends and its peers is
// lost until Heal. Only for a local cluster in namespaces (Shape.NetNS).
func (c *Cluster) CutNode(ctx context.Context, socket string) (*Partition, error) {
	ns := c.namespaces[socket]
	if ns == nil {
		return nil, fmt.Errorf("drill: the node of %s has no network namespace of its own", socket)
	}
	st, err := nodectl.GetStatus(ctx, socket)
	if err != nil {
		return nil, fmt.Errorf("drill: agent %s: %w", socket, err)
	}
	p := &Partition{Node: st.NodeID, At: time.Now(), ns: ns}
	if err := ns.Cut(); err != nil {
		return nil, err
	}
	return p, nil
}

// Heal brings the link back (once) and says when.
func (p *Partition) Heal() (time.Time, error) {
	if p.done {
		return time.Time{}, nil
	}
	p.done = true
	at := time.Now()
	return at, p.ns.Heal()
}

func (p *Partition) lift() (time.Time, error) { return p.Heal() }
func (p *Partition) node() string             { return p.Node }
func (p *Partition) kind() string             { return "link " + p.ns.Link + " down" }
func (p *Partition) partition() bool          { return true }

// isolation is what happened to an isolated node.
type isolation struct {
	cut                              cutoff
	at                               time.Time
	deregAt, removed, thawAt, backAt time.Time
	startedAtRemoval, startedAtThaw  uint64
	backGen                          []string
}

// isolate runs l steadily, freezes the agent of socket, waits for its
// victims to leave routing (watched from etcd revision rev) and for a
// load's worth of streams started and ended since, thaws it and waits
// for the victims back at higher generations; it returns the load's
// streams.
func (c *Cluster) isolate(ctx context.Context, l *Load, r *Recorder, socket string, victims []Worker, rev int64) (iso isolation, _ []*Stream, err error) {
	victim := map[string]bool{}
	for _, v := range victims {
		victim[v.InstanceID] = true
	}
	// The cut comes at a stream's first or second token on a victim, so
	// that the stream has most of its tokens ahead of it.
	serving := l.FirstToken(func(t Tok) bool { return victim[t.Instance] && t.Seq <= 2 })
	rounds := l.CountRounds()
	stop := l.Steady(ctx)
	defer func() {
		if err != nil {
			stop()
		}
	}()
	r.Event(time.Now(), EvLoadStart, "%d streams × %d tokens, each started again as it ends", l.Spec().Streams, l.Spec().MaxTokens)
	// A stream under way on the node before the freeze: it goes on
	// through it.
	select {
	case <-serving:
	case <-time.After(30 * time.Second):
		return iso, nil, fmt.Errorf("drill: no stream reached %v within 30 s", victims[0].InstanceID)
	}
	if iso.cut, iso.at, err = c.cutOff(ctx, socket, r); err != nil {
		return iso, nil, err
	}
	defer iso.cut.lift()
	for _, v := range victims {
		d, rm, err := c.Removed(ctx, Kill{Worker: v, At: iso.at, Rev: rev}, 30*time.Second)
		if err != nil {
			return iso, nil, err
		}
		iso.deregAt, iso.removed = later(iso.deregAt, d), later(iso.removed, rm)
	}
	// Behind a cut link the workers cannot be asked (nothing can reach
	// them either: the streams started meanwhile say where they went).
	if !iso.cut.partition() {
		if iso.startedAtRemoval, err = c.requestsStarted(ctx, victims); err != nil {
			return iso, nil, err
		}
	}
	rounds.Mark(iso.removed)
	r.Event(iso.deregAt, EvRemoved, "%s's registrations gone (lease expired)", iso.cut.node())
	r.Event(iso.removed, EvRemoved, "every frontend's routing view without them")
	select {
	case <-rounds.Enough():
	case <-time.After(time.Minute):
		return iso, nil, fmt.Errorf("drill: %d streams started after the removal did not end within a minute", l.Spec().Streams)
	case <-ctx.Done():
		return iso, nil, ctx.Err()
	}
	if !iso.cut.partition() {
		if iso.startedAtThaw, err = c.requestsStarted(ctx, victims); err != nil {
			return iso, nil, err
		}
	}
	if iso.thawAt, err = iso.cut.lift(); err != nil {
		return iso, nil, err
	}
	r.Event(iso.thawAt, EvPhase, "%s back after %.0f ms (%s lifted)", iso.cut.node(), ms(iso.thawAt.Sub(iso.at)), iso.cut.kind())
	for _, v := range victims {
		b, err := c.WaitBack(ctx, v.InstanceID, v.Generation, time.Minute)
		if err != nil {
			return iso, nil, err
		}
		iso.backAt = later(iso.backAt, time.Now())
		iso.backGen = append(iso.backGen, fmt.Sprintf("%s %d → %d", v.InstanceID, v.Generation, b.Generation))
		r.Event(time.Now(), EvRecovered, "%s ready again at generation %d (was %d)", v.InstanceID, b.Generation, v.Generation)
	}
	streams := stop()
	r.Event(time.Now(), EvLoadEnd, "")
	return iso, streams, nil
}

// cutOff isolates socket's node: its link down when it has a network
// namespace of its own, else its agent frozen.
func (c *Cluster) cutOff(ctx context.Context, socket string, r *Recorder) (cutoff, time.Time, error) {
	if c.namespaces[socket] != nil {
		p, err := c.CutNode(ctx, socket)
		if err != nil {
			return nil, time.Time{}, err
		}
		r.Event(p.At, EvFault, "link of %s down (%s): no etcd, no peers, no frontend", p.Node, p.ns.Link)
		return p, p.At, nil
	}
	f, err := c.FreezeAgent(ctx, socket)
	if err != nil {
		return nil, time.Time{}, err
	}
	r.Event(f.At, EvFault, "SIGSTOP agent of %s (pid %d): no lease renewal, its workers run on", f.Node, f.PID)
	return f, f.At, nil
}

// isolatedStreams counts the streams started while the node was out of
// routing (later), those of them whose first token came from a victim
// (reached), and the streams a victim served through the freeze without
// moving (kept).
func isolatedStreams(streams []*Stream, victims []Worker, iso isolation) (later, reached, kept int) {
	victim := map[string]bool{}
	for _, v := range victims {
		victim[v.InstanceID] = true
	}
	for _, s := range streams {
		if s.Started.After(iso.removed) && s.Started.Before(iso.thawAt) {
			later++
			if len(s.Tokens) > 0 && victim[s.Tokens[0].Instance] {
				reached++
			}
		}
		var last Tok
		for _, t := range s.Tokens {
			if t.At.Before(iso.at) {
				last = t
			}
		}
		if victim[last.Instance] && s.Err == nil && s.Result.Migrations == 0 && s.Tokens[len(s.Tokens)-1].At.After(iso.at) {
			kept++
		}
	}
	return later, reached, kept
}

// movedOff counts the streams a victim was serving when its link went
// down that went on elsewhere.
func movedOff(streams []*Stream, victims []Worker, iso isolation) int {
	victim := map[string]bool{}
	for _, v := range victims {
		victim[v.InstanceID] = true
	}
	n := 0
	for _, s := range streams {
		var before, after bool
		for _, t := range s.Tokens {
			before = before || (t.At.Before(iso.at) && victim[t.Instance])
			after = after || (t.At.After(iso.at) && !victim[t.Instance])
		}
		if before && after {
			n++
		}
	}
	return n
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// decodeWorkersOf lists the decode workers of the agent at socket.
func (c *Cluster) decodeWorkersOf(ctx context.Context, socket string) ([]Worker, error) {
	ws, err := c.Workers(ctx)
	if err != nil {
		return nil, err
	}
	var out []Worker
	for _, w := range ws {
		if w.Socket == socket && w.Role == "decode" {
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("drill: the node of %s runs no decode worker", socket)
	}
	return out, nil
}

// requestsStarted sums the workers' counts of requests started, asked of
// each worker itself (its agent may be frozen).
func (c *Cluster) requestsStarted(ctx context.Context, ws []Worker) (uint64, error) {
	var n uint64
	for _, w := range ws {
		h, err := c.WorkerHealth(ctx, w)
		if err != nil {
			return 0, err
		}
		n += h.RequestsStarted
	}
	return n, nil
}

// leaseTTL is the TTL etcd granted the lease of a registration read
// before the fault (0 when unknown).
func (c *Cluster) leaseTTL(ctx context.Context, resp *clientv3.GetResponse) time.Duration {
	if len(resp.Kvs) == 0 || resp.Kvs[0].Lease == 0 {
		return 0
	}
	ttl, err := c.Etcd.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	if err != nil {
		return 0
	}
	return time.Duration(ttl.GrantedTTL) * time.Second
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
