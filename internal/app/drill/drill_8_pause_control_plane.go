package drill

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// controlPlaneShape is drill 8's cluster: the standard one with etcd as
// three member processes, so that they can be frozen, and the leader
// killed.
var controlPlaneShape = Shape{Nodes: 2, DecodePerNode: 1, Prefill: 2, Frontends: 1, EtcdMembers: 3}

func init() {
	Register(Drill{Number: 8, Name: seedNames[8][0], Expect: seedNames[8][1], Shape: controlPlaneShape,
		LocalOnly: "it freezes and kills the etcd members it started", Run: runPauseControlPlane})
}

// runPauseControlPlane stops etcd under a steady load for the lease TTL
// and a second more, so that every agent also loses its lease and fences
// its workers, then starts it again:
//   - the streams in flight when it stopped go on and complete, on the
//     workers they were on (the data plane does not depend on etcd);
//   - streams started during the outage are routed by the frontends' last
//     view: served at once while the workers' leases last, then held
//     (the fenced workers refuse new work, typed and retryable) until the
//     cluster is back, within the capacity wait, never failed;
//   - afterwards it reconciles in full: every instance registered ready
//     again (at a higher generation where its lease was lost), every
//     frontend's record back with its routing view past those changes;
//   - every stream bit-identical to its reference, no gap, no duplicate.
func runPauseControlPlane(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	l := NewLoad(c, LoadSpec{Streams: cfg.Streams, MaxTokens: cfg.MaxTokens, Seed: cfg.Seed, Tag: "8"})
	defer l.Close()
	if err := l.Reference(ctx); err != nil {
		return err
	}
	regs, err := c.Etcd.Get(ctx, schema.InstancesPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("drill: etcd: %w", err)
	}
	ttl := c.leaseTTL(ctx, regs)
	gens, err := c.generations(ctx)
	if err != nil {
		return err
	}
	out, streams, err := c.etcdOutage(ctx, l, r, ttl+time.Second, gens)
	if err != nil {
		return err
	}
	st := outageStreams(streams, out.down, out.up)
	o := l.Compare(streams)
	Latencies(r, streams)
	r.Sample("ttft_during_outage_ms", st.ttftDuring...)
	figuresOf(r, o)
	r.Figure("lease_ttl_ms", float64(ttl.Milliseconds()))
	r.Figure("outage_ms", ms(out.up.Sub(out.down)))
	r.Figure("in_flight_at_outage", float64(st.inFlight))
	r.Figure("kept_through_outage", float64(st.kept))
	r.Figure("started_during_outage", float64(st.during))
	r.Figure("served_during_outage", float64(st.servedDuring))
	r.Figure("ttft_during_outage_p99_ms", Percentile(st.ttftDuring, 99))
	r.Figure("reregistered_ms", ms(out.regAt.Sub(out.up)))
	r.Figure("reconciled_ms", ms(out.ackAt.Sub(out.up)))
	r.Figure("generations_bumped", float64(out.bumped))
	var ck Check
	ck.That(st.inFlight > 0, "no stream was in flight when etcd stopped")
	ck.That(st.kept == st.inFlight, "%d of %d streams in flight at the outage completed", st.kept, st.inFlight)
	ck.That(st.during > 0, "no stream started during the outage")
	ck.That(o.Failed == 0, "%d streams failed (%v)", o.Failed, o.FirstError)
	ck.That(o.Gaps == 0 && o.Duplicates == 0, "%d gaps, %d duplicates", o.Gaps, o.Duplicates)
	ck.That(o.Identical == o.Streams, "%d of %d streams bit-identical", o.Identical, o.Streams)
	line := fmt.Sprintf("etcd down %.0f ms: %d in-flight streams went on, %d started meanwhile (%d served before it was back); reconciled %.0f ms after",
		ms(out.up.Sub(out.down)), st.inFlight, st.during, st.servedDuring, ms(out.ackAt.Sub(out.up)))
	if len(c.env.Members) >= 3 {
		k, err := c.leaderPhase(ctx, l, r, &ck)
		if err != nil {
			return err
		}
		line += fmt.Sprintf("; the etcd leader %s killed: a new one in %.0f ms, no stream or lease touched", k.leader, ms(k.elected.Sub(k.killed)))
	}
	ck.Verdict(r, line)
	return nil
}

// leaderPhase SIGKILLs the etcd leader under load (a cluster of 3 or
// more members): no stream may fail, move or differ, and no agent may
// lose its lease (no registration at a higher generation).
func (c *Cluster) leaderPhase(ctx context.Context, l *Load, r *Recorder, ck *Check) (leaderKill, error) {
	if err := c.WaitReady(ctx, time.Minute); err != nil {
		return leaderKill{}, err
	}
	k, streams, err := c.killLeader(ctx, l, r)
	if err != nil {
		return k, err
	}
	o := l.Compare(streams)
	r.Figure("etcd_members", float64(len(c.env.Members)))
	r.Figure("leader_election_ms", ms(k.elected.Sub(k.killed)))
	r.Figure("leader_rejoined_ms", ms(k.rejoined.Sub(k.killed)))
	r.Figure("leader_kill_streams", float64(o.Streams))
	r.Figure("leader_kill_migrations", float64(o.Migrations))
	r.Figure("leader_kill_generations_bumped", float64(k.bumped))
	ck.That(o.Failed == 0 && o.Identical == o.Streams, "the leader's kill: %d of %d streams failed (%v), %d bit-identical", o.Failed, o.Streams, o.FirstError, o.Identical)
	ck.That(o.Migrations == 0, "the leader's kill moved %d streams", o.Migrations)
	ck.That(k.bumped == 0, "the leader's kill cost %d registrations their lease (a higher generation)", k.bumped)
	return k, nil
}

// outage is when etcd went down and came back, and when the cluster had
// reconciled.
type outage struct {
	down, up, regAt, ackAt time.Time
	bumped                 int
}

// etcdOutage runs l steadily; once every stream is under way it freezes
// every etcd member for hold, resumes them and waits for the cluster to reconcile
// (every instance of gens registered ready, every frontend past it); it
// returns the load's streams.
func (c *Cluster) etcdOutage(ctx context.Context, l *Load, r *Recorder, hold time.Duration, gens map[string]uint64) (out outage, _ []*Stream, err error) {
	all := allUnderWay(l)
	stop := l.Steady(ctx)
	defer func() {
		if err != nil {
			stop()
		}
	}()
	r.Event(time.Now(), EvLoadStart, "%d streams × %d tokens, each started again as it ends", l.Spec().Streams, l.Spec().MaxTokens)
	select {
	case <-all:
	case <-time.After(time.Minute):
		return out, nil, fmt.Errorf("drill: the load's streams did not all get under way within a minute")
	}
	out.down = time.Now()
	if err := c.signalEtcd(syscall.SIGSTOP); err != nil {
		return out, nil, err
	}
	r.Event(out.down, EvFault, "every etcd member SIGSTOPped for %v (the lease TTL and a second)", hold)
	// The outage's length, not a wait for an event.
	<-time.After(hold - time.Since(out.down))
	if err := c.signalEtcd(syscall.SIGCONT); err != nil {
		return out, nil, err
	}
	out.up = time.Now()
	r.Event(out.up, EvRecovered, "etcd back after %.0f ms", ms(out.up.Sub(out.down)))
	if out.regAt, out.ackAt, out.bumped, err = c.reconciled(ctx, gens, time.Minute); err != nil {
		return out, nil, err
	}
	r.Event(out.regAt, EvRecovered, "every instance registered ready again (%d at a higher generation)", out.bumped)
	r.Event(out.ackAt, EvRecovered, "every frontend's record back, its routing view past them")
	streams := stop()
	r.Event(time.Now(), EvLoadEnd, "")
	return out, streams, nil
}

// signalEtcd sends sig to every etcd member process.
func (c *Cluster) signalEtcd(sig syscall.Signal) error {
	if len(c.env.Members) == 0 {
		return fmt.Errorf("drill: etcd does not run as member processes")
	}
	for _, m := range c.env.Members {
		if err := m.Signal(sig); err != nil {
			return fmt.Errorf("drill: %v to %s: %w", sig, m.Name, err)
		}
	}
	return nil
}

// outageCounts are the streams in flight when etcd went down (and those
// of them that completed), and those started while it was down (and
// those of them done before it came back, with their TTFTs).
type outageCounts struct {
	inFlight, kept, during, servedDuring int
	ttftDuring                           []float64
}

func outageStreams(streams []*Stream, down, up time.Time) outageCounts {
	var c outageCounts
	for _, s := range streams {
		if len(s.Tokens) == 0 {
			continue
		}
		first, last := s.Tokens[0].At, s.Tokens[len(s.Tokens)-1].At
		switch {
		case first.Before(down) && last.After(down):
			c.inFlight++
			if s.Err == nil {
				c.kept++
			}
		case s.Started.After(down) && s.Started.Before(up):
			c.during++
			c.ttftDuring = append(c.ttftDuring, ms(first.Sub(s.Started)))
			if s.Err == nil && s.Ended.Before(up) {
				c.servedDuring++
			}
		}
	}
	return c
}

// reconciled waits until every instance of gens is registered ready
// again (regAt; bumped counts those at a higher generation) and every
// frontend's record is back with its routing view past the newest
// registration (ackAt).
func (c *Cluster) reconciled(ctx context.Context, gens map[string]uint64, timeout time.Duration) (regAt, ackAt time.Time, bumped int, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		resp, gerr := c.Etcd.Get(ctx, schema.InstancesPrefix, clientv3.WithPrefix())
		if gerr == nil {
			ready, newest, n := 0, int64(0), 0
			for _, kv := range resp.Kvs {
				var reg schema.Registration
				if json.Unmarshal(kv.Value, &reg) != nil || !reg.Ready {
					continue
				}
				if g, ok := gens[reg.InstanceID]; ok {
					ready++
					newest = max(newest, kv.ModRevision)
					if reg.Generation > g {
						n++
					}
				}
			}
			last = fmt.Sprintf("%d of %d instances registered ready", ready, len(gens))
			if ready == len(gens) {
				if regAt.IsZero() {
					regAt, bumped = time.Now(), n
				}
				fr, ferr := c.Etcd.Get(ctx, schema.FrontendsPrefix, clientv3.WithPrefix())
				acked := 0
				for _, kv := range kvsOf(fr) {
					var f schema.FrontendRecord
					if json.Unmarshal(kv.Value, &f) == nil && f.AppliedRevision >= newest {
						acked++
					}
				}
				last = fmt.Sprintf("%d of %d frontends past revision %d (%v)", acked, len(c.URLs), newest, ferr)
				if ferr == nil && acked >= len(c.URLs) {
					return regAt, time.Now(), bumped, nil
				}
			}
		} else {
			last = gerr.Error()
		}
		select {
		case <-ctx.Done():
			return regAt, time.Time{}, bumped, fmt.Errorf("drill: the cluster did not reconcile within %v after etcd came back (%s)", timeout, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
