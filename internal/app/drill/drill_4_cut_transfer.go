package drill

import (
	"context"
	"fmt"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// CutFor is how long a cut transfer's source stays silent: longer than
// the frontend's bound on a hand-off's pull, so that the pull is given up
// and the prompt computed by the decode worker.
const CutFor = 8 * time.Second

// cutShape is drill 4's cluster: a decode worker on each node, the only
// prefill worker on the last node, whose agent cuts every KV fetch it
// serves halfway.
var cutShape = Shape{Nodes: 2, DecodePerNode: 1, Prefill: 1, Frontends: 1, CutTransfers: true}

func init() {
	Register(Drill{Number: 4, Name: seedNames[4][0], Expect: seedNames[4][1], Shape: cutShape,
		LocalOnly: "the cut is made by the source agent's failpoint, armed in the cluster the drill starts",
		Run:       runCutTransfer})
}

// runCutTransfer sends long prompts, each prefilled on the prefill worker
// of the last node; those decoded on the other node need its KV pulled
// across, and every such transfer stops halfway (the source sends half
// the blocks, then nothing). The destination must never make a block of
// a cut transfer ready (no block committed by a pull, the staged ones
// aborted), the frontend must give the pull up and have the decode worker
// compute the prompt, and every stream must end bit-identical to a run of
// it made after the fault (from the KV the recompute published), with no
// slot, lease or pull left behind once the silent source gives up.
func runCutTransfer(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	l := NewLoad(c, LoadSpec{Streams: min(max(cfg.Streams, 4), 6), MaxTokens: max(cfg.MaxTokens/4, 4), PromptWords: 600, Seed: cfg.Seed,
		Tag: fmt.Sprintf("4.%d", time.Now().UnixNano())})
	defer l.Close()
	base, err := holding(ctx, c)
	if err != nil {
		return err
	}
	before, err := c.Metrics(ctx)
	if err != nil {
		return err
	}
	tBefore, err := c.transferStats(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	r.Event(start, EvFault, "every KV fetch served by %s stops halfway for %v", c.Sockets[len(c.Sockets)-1], CutFor)
	r.Event(start, EvLoadStart, "%d streams with ~600-word prompts", l.Spec().Streams)
	streams := l.Run(ctx)
	r.Event(time.Now(), EvLoadEnd, "")
	after, err := c.Metrics(ctx)
	if err != nil {
		return err
	}
	tAfter, err := c.transferStats(ctx)
	if err != nil {
		return err
	}
	failed := Delta(before, after, `lifeline_frontend_pd_handoffs_total{path="transfer_failed"}`)
	transferred := Delta(before, after, `lifeline_frontend_pd_handoffs_total{path="transfer"}`)
	sameNode := Delta(before, after, `lifeline_frontend_pd_handoffs_total{path="same_node"}`)
	var recovered []float64
	for _, s := range streams {
		if len(s.Tokens) > 0 {
			recovered = append(recovered, ms(s.Tokens[0].At.Sub(s.Started)))
		}
	}
	if err := l.Reference(ctx); err != nil {
		return err
	}
	o := l.Compare(streams)
	Latencies(r, streams)
	figuresOf(r, o)
	left, err := waitNoOrphans(ctx, c, CutFor+15*time.Second)
	if err != nil {
		return err
	}
	r.Event(time.Now(), EvRecovered, "no slot, lease or pull left on any node")
	for _, t := range c.Traces(ctx, r, streams, 2, "lifeline.kv_transfer") {
		for _, sp := range t {
			if sp.Name == "lifeline.kv_transfer" && sp.Error != "" {
				r.Sample("cut_transfer_ms", ms(sp.End.Sub(sp.Start)))
			}
		}
	}
	r.Figure("transfers_cut", failed)
	r.Figure("transfers_completed", transferred)
	r.Figure("same_node_handoffs", sameNode)
	r.Figure("pulls_failed", float64(tAfter.PullsFailed-tBefore.PullsFailed))
	r.Figure("blocks_committed_by_pulls", float64(tAfter.BlocksPulled-tBefore.BlocksPulled))
	r.Figure("staged_aborted", float64(tAfter.StagedAborted-tBefore.StagedAborted))
	r.Figure("ttft_p99_ms", Percentile(recovered, 99))
	r.Figure("leaked_slots", float64(left.over(base).slots))
	r.Figure("leaked_leases", float64(left.over(base).leases))
	r.Figure("leaked_pulls", float64(left.over(base).pulls))
	var ck Check
	ck.That(failed > 0, "no hand-off went through a cut transfer (%v completed, %v on the same node)", transferred, sameNode)
	ck.That(transferred == 0, "%v transfers completed through a cut source", transferred)
	ck.That(tAfter.BlocksPulled == tBefore.BlocksPulled, "%d blocks of cut transfers were committed", tAfter.BlocksPulled-tBefore.BlocksPulled)
	ck.That(tAfter.PullsFailed > tBefore.PullsFailed, "no pull was counted failed")
	ck.That(o.Failed == 0, "%d streams failed (%v)", o.Failed, o.FirstError)
	ck.That(o.Identical == o.Streams, "%d of %d streams bit-identical", o.Identical, o.Streams)
	ck.That(left.over(base) == (leaks{}), "left behind: %+v (before: %+v)", left, base)
	ck.Verdict(r, fmt.Sprintf("%v transfers cut halfway: no block of them ready, the prompts computed by the decode workers; all %d streams bit-identical; nothing left behind",
		failed, o.Streams))
	return nil
}

// transferStats sums every node's transfer counters.
func (c *Cluster) transferStats(ctx context.Context) (controlapi.TransferStats, error) {
	sts, err := c.Statuses(ctx)
	if err != nil {
		return controlapi.TransferStats{}, err
	}
	var t controlapi.TransferStats
	for _, st := range sts {
		s := st.KVTransfer.Stats
		t.PullsFailed += s.PullsFailed
		t.PullsOK += s.PullsOK
		t.BlocksPulled += s.BlocksPulled
		t.StagedAborted += s.StagedAborted
		t.FetchesServed += s.FetchesServed
	}
	return t, nil
}
