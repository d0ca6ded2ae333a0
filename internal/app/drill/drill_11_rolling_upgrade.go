package drill

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/agent/schema"
)

func init() {
	Register(Drill{Number: 11, Name: seedNames[11][0], Expect: seedNames[11][1], Shape: Standard, Run: runRolling})
}

// runRolling asks every node to drain at once under a steady load (as an
// impatient operator would: the disruption budget must give them turns),
// undrains each node once it is drained, and waits until every node has
// been drained once and is serving again. It checks that no more nodes
// than the budget were ever out at once, that no request was routed to
// a node after it left routing, and that no stream failed or differed.
func runRolling(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	l := NewLoad(c, LoadSpec{Streams: cfg.Streams, MaxTokens: cfg.MaxTokens, Seed: cfg.Seed, Tag: "11"})
	defer l.Close()
	if err := l.Reference(ctx); err != nil {
		return err
	}
	budget := disruptionBudget(ctx, c)
	stop := l.Steady(ctx)
	r.Event(time.Now(), EvLoadStart, "%d streams × %d tokens, each started again as it ends", cfg.Streams, cfg.MaxTokens)
	for _, s := range c.Sockets {
		go nodectl.Drain(ctx, s, controlapi.DrainRequest{Deadline: "10s", HardDeadline: "30s"})
	}
	r.Event(time.Now(), EvFault, "drain asked of all %d nodes at once (budget %d)", len(c.Sockets), budget)
	roll, err := followRolling(ctx, c, r, 3*time.Minute)
	streams := stop()
	r.Event(time.Now(), EvLoadEnd, "")
	if err != nil {
		return err
	}
	o := l.Compare(streams)
	Latencies(r, streams)
	figuresOf(r, o)
	r.Figure("disruption_budget", float64(budget))
	r.Figure("max_unavailable", float64(roll.maxOut))
	r.Figure("nodes_drained", float64(len(roll.drained)))
	r.Figure("routed_after_not_ready", float64(roll.routedAfter))
	r.Figure("finished_in_place", float64(roll.inPlace))
	r.Figure("moved", float64(roll.moved))
	var ck Check
	ck.That(len(roll.drained) == len(c.Sockets), "%d of %d nodes drained", len(roll.drained), len(c.Sockets))
	ck.That(roll.maxOut <= budget, "%d nodes out at once (budget %d)", roll.maxOut, budget)
	ck.That(roll.routedAfter == 0, "%d requests routed to a node after it left routing", roll.routedAfter)
	ck.That(o.Failed == 0, "%d of %d streams failed (%v)", o.Failed, o.Streams, o.FirstError)
	ck.That(o.Identical == o.Streams, "%d of %d streams bit-identical", o.Identical, o.Streams)
	ck.Verdict(r, fmt.Sprintf("%d nodes drained and back in turn, at most %d out at once; %d streams, none failed, all bit-identical",
		len(roll.drained), roll.maxOut, o.Streams))
	return nil
}

// disruptionBudget is the cluster's max_unavailable (1 when unset or
// without etcd).
func disruptionBudget(ctx context.Context, c *Cluster) int {
	if c.Etcd == nil {
		return 1
	}
	resp, err := c.Etcd.Get(ctx, schema.MaxUnavailableKey)
	if err != nil || len(resp.Kvs) == 0 {
		return 1
	}
	n, err := strconv.Atoi(string(resp.Kvs[0].Value))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

type rolling struct {
	drained        map[string]bool
	maxOut         int
	routedAfter    int
	inPlace, moved int
	phases         map[string]string
}

// followRolling polls every node's drain, undrains each node once it is
// drained, and returns once every node was drained and the cluster is
// whole again (no drain, every worker ready).
func followRolling(ctx context.Context, c *Cluster, r *Recorder, timeout time.Duration) (rolling, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	roll := rolling{drained: map[string]bool{}, phases: map[string]string{}}
	for {
		sts, err := c.Statuses(ctx)
		if err != nil {
			return roll, err
		}
		out, whole := 0, len(roll.drained) == len(c.Sockets)
		for i, st := range sts {
			phase := ""
			if st.Drain != nil {
				phase = st.Drain.Phase
			}
			if phase != roll.phases[st.NodeID] {
				r.Event(time.Now(), EvPhase, "%s: %s", st.NodeID, orBack(phase))
				roll.phases[st.NodeID] = phase
			}
			if phase != "" && phase != controlapi.DrainWaitingForBudget {
				out++
			}
			for _, w := range st.Instances {
				whole = whole && phase == "" && w.Ready
			}
			if phase == controlapi.DrainDrained && !roll.drained[st.NodeID] {
				d := st.Drain
				roll.drained[st.NodeID] = true
				roll.routedAfter += d.RoutedAfterNotReady
				roll.inPlace += d.FinishedInPlace
				roll.moved += d.ForcedEnded
				if _, err := nodectl.Undrain(ctx, c.Sockets[i]); err != nil {
					return roll, fmt.Errorf("drill: undrain %s: %w", st.NodeID, err)
				}
			}
		}
		roll.maxOut = max(roll.maxOut, out)
		if whole {
			r.Event(time.Now(), EvRecovered, "every node drained once and serving again")
			return roll, nil
		}
		select {
		case <-ctx.Done():
			return roll, fmt.Errorf("drill: the rolling drain did not complete within %v (phases %v)", timeout, roll.phases)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func orBack(phase string) string {
	if phase == "" {
		return "serving"
	}
	return phase
}
