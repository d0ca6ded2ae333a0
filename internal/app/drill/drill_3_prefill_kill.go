package drill

import (
	"context"
	"fmt"
	"strings"
	"time"
)

func init() {
	Register(Drill{Number: 3, Name: seedNames[3][0], Expect: seedNames[3][1], Shape: Standard, Run: runPrefillKill})
}

// prefillAttempts bounds how often drill 3 tries to catch a prefill
// worker mid-prompt.
const prefillAttempts = 3

// runPrefillKill sends long prompts (each prefilled on a prefill
// instance) and SIGKILLs a prefill worker while it computes one: the
// frontends must count the failure, prefill the prompt again, and every
// stream must end bit-identical to a fault-free run of it (made after
// the fault: a run before would leave the prompts cached, and no prefill
// would happen); the dead worker's node must be left with no unpublished
// block (nothing it wrote and did not publish is ever readable).
func runPrefillKill(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	for attempt := 1; ; attempt++ {
		done, err := prefillKillOnce(ctx, c, cfg, r, attempt)
		if err != nil || done || attempt == prefillAttempts {
			if err == nil && !done {
				r.Verdict(Fail, "no prefill worker was caught computing a prompt in %d attempts", attempt)
			}
			return err
		}
		r.Event(time.Now(), EvPhase, "attempt %d: the kill found no prompt in flight; again", attempt)
		if err := c.WaitReady(ctx, time.Minute); err != nil {
			return err
		}
	}
}

// prefillKillOnce is one attempt; done is false when the kill caught no
// prefill in flight.
func prefillKillOnce(ctx context.Context, c *Cluster, cfg Config, r *Recorder, attempt int) (done bool, err error) {
	ws, err := c.Workers(ctx)
	if err != nil {
		return false, err
	}
	var prefills []Worker
	for _, w := range ws {
		if w.Role == "prefill" {
			prefills = append(prefills, w)
		}
	}
	if len(prefills) == 0 {
		return false, fmt.Errorf("drill: no prefill worker")
	}
	l := NewLoad(c, LoadSpec{Streams: min(cfg.Streams, 4), MaxTokens: max(cfg.MaxTokens/4, 4), PromptWords: 600, Seed: cfg.Seed,
		Tag: fmt.Sprintf("3.%d.%d", attempt, time.Now().UnixNano())})
	defer l.Close()
	before, err := c.Metrics(ctx)
	if err != nil {
		return false, err
	}
	var streams []*Stream
	ran := make(chan struct{})
	start := time.Now()
	r.Event(start, EvLoadStart, "attempt %d: %d streams with ~600-word prompts", attempt, l.Spec().Streams)
	go func() { defer close(ran); streams = l.Run(ctx) }()
	k, kerr := killWhenBusy(ctx, c, prefills, ran)
	<-ran
	r.Event(time.Now(), EvLoadEnd, "")
	if kerr != nil {
		return false, kerr
	}
	r.Event(k.At, EvFault, "SIGKILL prefill %s (pid %d, generation %d)", k.InstanceID, k.PID, k.Generation)
	after, err := c.Metrics(ctx)
	if err != nil {
		return false, err
	}
	failures := Delta(before, after, "lifeline_frontend_prefill_failures_total")
	if failures == 0 {
		return false, nil
	}
	if ev, err := c.Detected(ctx, k, 10*time.Second); err == nil {
		r.Event(ev.DetectedAt, EvDetected, "exit seen by the agent (%s)", ev.Detector)
		r.Figure("detection_ms", ms(ev.DetectedAt.Sub(k.At)))
	}
	if err := l.Reference(ctx); err != nil {
		return false, err
	}
	o := l.Compare(streams)
	Latencies(r, streams)
	figuresOf(r, o)
	leaked, err := waitNoOrphans(ctx, c, 15*time.Second)
	if err != nil {
		return false, err
	}
	r.Event(time.Now(), EvRecovered, "no unpublished block left on any node")
	handoffs := Delta(before, after, "lifeline_frontend_pd_handoffs_total") - Delta(before, after, `lifeline_frontend_pd_handoffs_total{path="no_prefill"}`)
	r.Figure("prefill_failures", failures)
	r.Figure("prefill_handoffs", handoffs)
	r.Figure("leaked_slots", float64(leaked.slots))
	r.Figure("leaked_leases", float64(leaked.leases))
	r.Figure("leaked_pulls", float64(leaked.pulls))
	r.Figure("attempts", float64(attempt))
	var ck Check
	ck.That(o.Failed == 0, "%d streams failed (%v)", o.Failed, o.FirstError)
	ck.That(o.Identical == o.Streams, "%d of %d streams bit-identical", o.Identical, o.Streams)
	ck.That(leaked == (leaks{}), "left behind: %+v", leaked)
	ck.Verdict(r, fmt.Sprintf("%v prefill(s) lost with %s were prefilled again; all %d streams bit-identical; no unpublished block left",
		failures, k.InstanceID, o.Streams))
	return true, nil
}

// killWhenBusy SIGKILLs the first of ws that reports a request in flight
// (with the certificates to ask them: the router decides which prefill
// worker a prompt goes to), or the first of ws 150 ms after the load
// started without them; it kills the first when the load ends first.
func killWhenBusy(ctx context.Context, c *Cluster, ws []Worker, ran <-chan struct{}) (Kill, error) {
	deadline := time.After(150 * time.Millisecond)
	for {
		if c.Certs != "" {
			deadline = nil
			for _, w := range ws {
				if h, err := c.WorkerHealth(ctx, w); err == nil && h.InFlight > 0 {
					return c.KillWorker(ctx, w.InstanceID)
				}
			}
		}
		select {
		case <-ran:
			return c.KillWorker(ctx, ws[0].InstanceID)
		case <-deadline:
			return c.KillWorker(ctx, ws[0].InstanceID)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// leaks are what the nodes hold beyond finished requests: slots being
// allocated, written or sealed, read leases, pulls in progress.
type leaks struct{ slots, leases, pulls int }

// holding sums what every node holds now.
func holding(ctx context.Context, c *Cluster) (leaks, error) {
	sts, err := c.Statuses(ctx)
	if err != nil {
		return leaks{}, err
	}
	var l leaks
	for _, st := range sts {
		by, _ := st.Arena["by_state"].(map[string]any)
		for _, s := range []string{"ALLOCATED", "WRITING", "SEALED"} {
			v, _ := by[s].(float64)
			l.slots += int(v)
		}
		v, _ := st.Arena["leases"].(float64)
		l.leases += int(v)
		l.pulls += int(st.KVTransfer.Stats.PullsInProgress)
	}
	return l, nil
}

// holders names, node by node, the writer sessions holding unpublished
// slots: who a leak of slots belongs to.
func holders(ctx context.Context, c *Cluster) string { return heldBy(ctx, c, "unpublished_by_writer") }

// leaseHolders names, node by node, the sessions holding leases on
// published slots: who a leak of leases belongs to.
func leaseHolders(ctx context.Context, c *Cluster) string { return heldBy(ctx, c, "leases_by_session") }

// heldBy lists, node by node, the arena status's per-session counts
// under key.
func heldBy(ctx context.Context, c *Cluster, key string) string {
	sts, err := c.Statuses(ctx)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, st := range sts {
		if by, _ := st.Arena[key].(map[string]any); len(by) > 0 {
			out = append(out, fmt.Sprintf("%s: %v", st.NodeID, by))
		}
	}
	return strings.Join(out, "; ")
}

// over is what l holds beyond base (a leak), field by field: holding
// less than before (something of an earlier drill released since) is
// none.
func (l leaks) over(base leaks) leaks {
	return leaks{slots: max(0, l.slots-base.slots), leases: max(0, l.leases-base.leases), pulls: max(0, l.pulls-base.pulls)}
}

// waitNoOrphans waits (up to timeout: sweepers and cancels run
// asynchronously) until no node holds anything for a request, and
// returns what is left then.
func waitNoOrphans(ctx context.Context, c *Cluster, timeout time.Duration) (leaks, error) {
	end := time.After(timeout)
	for {
		l, err := holding(ctx, c)
		if err != nil || l == (leaks{}) {
			return l, err
		}
		select {
		case <-end:
			return l, nil
		case <-ctx.Done():
			return l, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
