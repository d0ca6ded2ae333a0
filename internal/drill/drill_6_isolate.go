package drill

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
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
func runIsolate(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	socket := c.Sockets[len(c.Sockets)-1]
	ws, err := c.Workers(ctx)
	if err != nil {
		return err
	}
	var victims []Worker
	for _, w := range ws {
		if w.Socket == socket && w.Role == "decode" {
			victims = append(victims, w)
		}
	}
	if len(victims) == 0 {
		return fmt.Errorf("drill: the node of %s runs no decode worker", socket)
	}
	l := NewLoad(c, LoadSpec{Streams: cfg.Streams, MaxTokens: max(cfg.MaxTokens/2, 8), Seed: cfg.Seed, Tag: "6"})
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
	rev, ttl := resp.Header.Revision, c.leaseTTL(ctx, resp)

	var (
		mu        sync.Mutex
		removedAt time.Time
		after     int // streams started after the removal that ended
		enough    = make(chan struct{})
	)
	l.OnEnd = func(s *Stream) {
		mu.Lock()
		defer mu.Unlock()
		if !removedAt.IsZero() && s.Started.After(removedAt) {
			if after++; after == l.Spec().Streams {
				close(enough)
			}
		}
	}
	stop := l.Steady(ctx)
	r.Event(time.Now(), EvLoadStart, "%d streams × %d tokens, each started again as it ends", cfg.Streams, l.Spec().MaxTokens)
	// A stream or two under way before the freeze: the isolated node's
	// worker serves some of them through it.
	<-time.After(200 * time.Millisecond)
	f, err := c.FreezeAgent(ctx, socket)
	if err != nil {
		stop()
		return err
	}
	defer f.Thaw()
	r.Event(f.At, EvFault, "SIGSTOP agent of %s (pid %d): no lease renewal, its workers run on", f.Node, f.PID)

	// Removed: every victim's registration gone and every frontend's view
	// past it.
	var deregAt, removed time.Time
	for _, v := range victims {
		d, rm, err := c.Removed(ctx, Kill{Worker: v, At: f.At, Rev: rev}, 30*time.Second)
		if err != nil {
			stop()
			return err
		}
		deregAt, removed = later(deregAt, d), later(removed, rm)
	}
	startedAtRemoval, err := c.requestsStarted(ctx, victims)
	if err != nil {
		stop()
		return err
	}
	mu.Lock()
	removedAt = removed
	mu.Unlock()
	r.Event(deregAt, EvRemoved, "%s's registrations gone (lease expired)", f.Node)
	r.Event(removed, EvRemoved, "every frontend's routing view without them")
	select {
	case <-enough:
	case <-time.After(time.Minute):
		stop()
		return fmt.Errorf("drill: %d streams started after the removal did not end within a minute", l.Spec().Streams)
	case <-ctx.Done():
		stop()
		return ctx.Err()
	}
	startedAtThaw, err := c.requestsStarted(ctx, victims)
	if err != nil {
		stop()
		return err
	}
	thawAt, err := f.Thaw()
	if err != nil {
		stop()
		return err
	}
	r.Event(thawAt, EvPhase, "SIGCONT agent of %s after %.0f ms", f.Node, ms(thawAt.Sub(f.At)))
	var backAt time.Time
	var backGen []string
	for _, v := range victims {
		b, err := c.WaitBack(ctx, v.InstanceID, v.Generation, time.Minute)
		if err != nil {
			stop()
			return err
		}
		backAt = later(backAt, time.Now())
		backGen = append(backGen, fmt.Sprintf("%s %d → %d", v.InstanceID, v.Generation, b.Generation))
		r.Event(time.Now(), EvRecovered, "%s ready again at generation %d (was %d)", v.InstanceID, b.Generation, v.Generation)
	}
	streams := stop()
	r.Event(time.Now(), EvLoadEnd, "")
	afterM, err := c.Metrics(ctx)
	if err != nil {
		return err
	}
	victim := map[string]bool{}
	for _, v := range victims {
		victim[v.InstanceID] = true
	}
	var reachedStreams, later int
	for _, s := range streams {
		if !s.Started.After(removed) || !s.Started.Before(thawAt) {
			continue
		}
		later++
		if len(s.Tokens) > 0 && victim[s.Tokens[0].Instance] {
			reachedStreams++
		}
	}
	reached := startedAtThaw - startedAtRemoval
	// Streams the isolated workers served through the freeze stay there.
	kept := 0
	for _, s := range streams {
		var last Tok
		for _, t := range s.Tokens {
			if t.At.Before(f.At) {
				last = t
			}
		}
		if victim[last.Instance] && s.Err == nil && s.Result.Migrations == 0 && len(s.Tokens) > 0 && s.Tokens[len(s.Tokens)-1].At.After(f.At) {
			kept++
		}
	}
	o := l.Compare(streams)
	Latencies(r, streams)
	figuresOf(r, o)
	r.Figure("lease_ttl_ms", float64(ttl.Milliseconds()))
	r.Figure("deregistered_ms", ms(deregAt.Sub(f.At)))
	r.Figure("removed_ms", ms(removed.Sub(f.At)))
	r.Figure("isolated_ms", ms(thawAt.Sub(f.At)))
	r.Figure("back_ms", ms(backAt.Sub(thawAt)))
	r.Figure("streams_while_isolated", float64(later))
	r.Figure("kept_through_freeze", float64(kept))
	r.Figure("reached_isolated_worker", float64(reached)+float64(reachedStreams))
	r.Figure("routed_to_not_ready", Delta(before, afterM, "lifeline_frontend_routed_to_not_ready_total"))
	var ck Check
	ck.That(later > 0, "no stream started while the node was isolated")
	ck.That(reached == 0 && reachedStreams == 0, "%d requests started on the isolated workers after their removal (%d streams)", reached, reachedStreams)
	ck.That(o.Failed == 0, "%d streams failed (%v)", o.Failed, o.FirstError)
	ck.That(o.Gaps == 0 && o.Duplicates == 0, "%d gaps, %d duplicates", o.Gaps, o.Duplicates)
	ck.That(o.Identical == o.Streams, "%d of %d streams bit-identical", o.Identical, o.Streams)
	ck.Verdict(r, fmt.Sprintf("%s isolated: out of routing %.0f ms after the freeze; none of %d streams started meanwhile reached it; back at %v",
		f.Node, ms(removed.Sub(f.At)), later, backGen))
	return nil
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
