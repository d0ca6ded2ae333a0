package drill

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/lifeline-llm/lifeline/internal/app/overload"
)

// burstShape is drill 9's cluster: two decode workers on one node with
// small, known limits, so that 3× their capacity is a burst a 2-core
// machine can offer, each computing on one thread (the interactive
// latency measured is the scheduler's, not two workers fighting for the
// same cores).
var burstShape = Shape{Nodes: 1, DecodePerNode: 2, Frontends: 1, MaxRunning: 4, MaxQueued: 12, Threads: 1}

// BurstFactor is drill 9's offered load: this many times what the
// workers hold.
const BurstFactor = 3

// MinBurstTokens is the shortest stream drill 9 runs: the refusals of a
// burst take their CPU at its start, and goodput is measured over streams
// long enough that they are a small part of it.
const MinBurstTokens = 64

func init() {
	Register(Drill{Number: 9, Name: seedNames[9][0], Expect: seedNames[9][1], Shape: burstShape,
		LocalOnly: "the burst is sized from the workers' slot and queue limits, which the drill sets on the cluster it starts",
		Run:       runBurst})
}

// runBurst offers BurstFactor × capacity streamed requests at once,
// between two capacity runs, and then floods the workers with batch
// requests while interactive ones are timed:
//   - every request is served or refused before its 200 (429 with
//     Retry-After): the bounded queues hold;
//   - retry amplification (worker attempts ÷ requests, from the frontend's
//     metrics) ≤ overload.MaxAmplification;
//   - goodput ≥ overload.MinGoodput of the capacity runs';
//   - interactive TTFT p99 under the batch flood ≤
//     overload.MaxInteractiveSlowdown × its unloaded value.
func runBurst(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	capacity := c.shape.Capacity()
	if capacity == 0 {
		return fmt.Errorf("drill: the cluster's worker limits are not known")
	}
	l := overload.Load{URL: c.URLs[0], MetricsURL: c.MetricsURLs[0], Model: c.Model,
		Prompt: "Drill 9: a burst of traffic", MaxTokens: max(cfg.MaxTokens, MinBurstTokens)}
	r.Event(time.Now(), EvLoadStart, "capacity %d (%d workers × %d slots + %d queued), then %d× that at once",
		capacity, c.shape.Nodes*c.shape.DecodePerNode, c.shape.MaxRunning, c.shape.MaxQueued, BurstFactor)
	v, err := overload.Drill(ctx, l, capacity, BurstFactor)
	if err != nil {
		return err
	}
	for _, p := range []struct {
		name string
		f    overload.Figures
	}{{"capacity run", v.Capacity}, {fmt.Sprintf("%d× burst", BurstFactor), v.Burst}, {"capacity run", v.After}} {
		r.Event(p.f.Start, EvPhase, "%s: %d requests", p.name, p.f.Offered)
		r.Event(p.f.Start.Add(p.f.Wall), EvPhase, "%s ended: %d served, %d refused, %d failed, goodput %.1f/s",
			p.name, p.f.Served, p.f.Refused, p.f.Failed, p.f.Goodput)
	}
	var ttft, took []float64
	for _, res := range v.BurstResults {
		if res.OK() {
			ttft, took = append(ttft, ms(res.TTFT)), append(took, ms(res.Took))
		}
	}
	r.Sample("ttft_ms", ttft...)
	r.Sample("stream_ms", took...)

	inter := overload.Load{URL: l.URL, MetricsURL: l.MetricsURL, Model: c.Model,
		Prompt: strings.Repeat("Drill 9: a quick interactive question. ", 20), MaxTokens: 4}
	batch := overload.Load{URL: l.URL, MetricsURL: l.MetricsURL, Model: c.Model,
		Prompt: "Drill 9: a long batch job", MaxTokens: 8 * l.MaxTokens, Priority: "batch"}
	iso, err := overload.InteractiveUnderFlood(ctx, inter, batch, 16, BurstFactor*capacity, func(ctx context.Context) (bool, error) {
		return c.batchHoldsWorkers(ctx)
	})
	if err != nil {
		return err
	}
	r.Event(iso.Flood.Start, EvFault, "batch flood: %d requests at once", BurstFactor*capacity)
	r.Event(iso.Filled, EvPhase, "the flood holds the batch share of every worker")
	r.Event(iso.Flood.Start.Add(iso.Flood.Wall), EvPhase, "flood ended: %d served, %d refused", iso.Flood.Served, iso.Flood.Refused)

	r.Figure("capacity", float64(capacity))
	r.Figure("offered", float64(v.Burst.Offered))
	r.Figure("served", float64(v.Burst.Served))
	r.Figure("refused", float64(v.Burst.Refused))
	r.Figure("failed", float64(v.Burst.Failed+iso.Flood.Failed))
	r.Figure("retry_amplification", v.Burst.Amplification)
	r.Figure("goodput_ratio", v.GoodputRatio)
	r.Figure("goodput_per_s", v.Burst.Goodput)
	r.Figure("capacity_goodput_per_s", (v.Capacity.Goodput+v.After.Goodput)/2)
	r.Figure("ttft_p99_ms", ms(v.Burst.TTFTp99))
	r.Figure("interactive_ttft_p99_unloaded_ms", ms(iso.Unloaded))
	r.Figure("interactive_ttft_p99_flood_ms", ms(iso.Loaded))
	r.Figure("interactive_slowdown", iso.Slowdown)
	var ck Check
	for _, f := range append(v.Failures, iso.Failures...) {
		ck.That(false, "%s", f)
	}
	ck.Verdict(r, fmt.Sprintf("%d offered at %d× capacity: %d served, %d refused before any 200; amplification %.3f, goodput %.2f of capacity; interactive TTFT p99 %.2f× under a batch flood",
		v.Burst.Offered, BurstFactor, v.Burst.Served, v.Burst.Refused, v.Burst.Amplification, v.GoodputRatio, iso.Slowdown))
	return nil
}

// batchHoldsWorkers reports whether every decode worker has half its
// queue taken (batch requests queue only once the batch share of the
// slots runs).
func (c *Cluster) batchHoldsWorkers(ctx context.Context) (bool, error) {
	ws, err := c.Workers(ctx)
	if err != nil {
		return false, err
	}
	for _, w := range ws {
		if w.Role != "decode" {
			continue
		}
		h, err := c.WorkerHealth(ctx, w)
		if err != nil {
			return false, err
		}
		if h.Running == 0 || int(h.Queued) < c.shape.MaxQueued/2 {
			return false, nil
		}
	}
	return true, nil
}
