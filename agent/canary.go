package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
)

// canaryTokens is how many tokens a canary asks for; every chunk is checked.
const canaryTokens = 4

// canaryLoop runs a real generation on the instance's canary lane: once at
// start (an instance is ready only after one passes), then every
// CanaryIdle ±20% unless the instance is busy and progressing. A failure
// makes the instance not ready; CanaryFailures in a row kill it for a
// restart. A canary on a busy worker that timed out (or was refused while
// the previous one still waits) is no failure if the worker computed
// something meanwhile: a busy worker is judged by its progress.
func (a *Agent) canaryLoop(ctx context.Context, inst *instance, gen uint64, proc *os.Process) {
	var client *workerclient.Client
	closeClient := func() {
		if client != nil {
			a.metrics.staleGen.Add(float64(client.StaleFrames()))
			client.Close()
			client = nil
		}
	}
	defer closeClient()
	var seen progress
	wait := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		idle := time.Duration(a.opts.CanaryIdle)
		wait = idle + time.Duration((rand.Float64()*0.4-0.2)*float64(idle))
		// Dial anew after any failure: a QUIC connection idles out while a
		// worker is paused, and a dial failure is a canary failure too.
		if client == nil {
			a.mu.Lock()
			addr := inst.addr
			a.mu.Unlock()
			dctx, cancel := context.WithTimeout(ctx, time.Duration(a.opts.CanaryTimeout)+time.Second)
			c, err := workerclient.DialFrom(dctx, net.ParseIP(a.opts.BindAddress), addr, a.tlsConf, inst.id, gen)
			timedOut := errors.Is(dctx.Err(), context.DeadlineExceeded)
			cancel()
			if err != nil {
				reason := controlapi.ReasonCanaryError
				if timedOut {
					reason = controlapi.ReasonCanaryTimeout // a worker that cannot even handshake is stuck
				}
				if ctx.Err() != nil || !a.canaryResult(inst, gen, reason, err, proc) {
					return
				}
				continue
			}
			client = c
		}
		skip, busy, allowance := a.look(ctx, client, inst, &seen)
		if skip {
			continue
		}
		reason, err := a.canary(ctx, client, inst.id, gen, allowance)
		if ctx.Err() != nil {
			return
		}
		if err != nil && busy && waitedBehindWork(reason, err) && a.progressed(ctx, client, &seen) {
			// Slower than its allowance (the load grew), but the worker
			// kept computing meanwhile: judged by its progress.
			a.metrics.canary.WithLabelValues("slow_but_progressing").Inc()
			continue
		}
		if err != nil {
			closeClient()
		}
		if !a.canaryResult(inst, gen, reason, err, proc) {
			return
		}
	}
}

// progress is what the canary loop last saw of a worker's work, and when
// that last moved.
type progress struct {
	tokens, positions uint64
	at                time.Time
}

// moved records now's counters and reports whether they moved since last.
func (p *progress) moved(h *wire.HealthReply) bool {
	moved := h.TokensGenerated != p.tokens || h.PositionsComputed != p.positions
	p.tokens, p.positions = h.TokensGenerated, h.PositionsComputed
	if moved || p.at.IsZero() {
		p.at = time.Now()
	}
	return moved
}

// maxCanaryAllowance caps the time a canary is given on top of
// canary_timeout for the steps it queues behind, whatever step time a
// worker reports.
const maxCanaryAllowance = time.Minute

// look asks the worker how it is doing and records its load. It reports
// whether the worker is busy and progressing — new tokens or newly
// computed positions (a prefill samples no token) since the last look —
// so that its traffic is the liveness proof and no canary is needed; and
// otherwise how long a canary may take beyond canary_timeout.
func (a *Agent) look(ctx context.Context, c *workerclient.Client, inst *instance, last *progress) (skip, busy bool, allowance time.Duration) {
	hctx, cancel := context.WithTimeout(ctx, time.Duration(a.opts.CanaryTimeout))
	h, err := c.Health(hctx)
	cancel()
	if err != nil {
		return false, false, 0 // no word from the worker: its canary gets no allowance
	}
	a.metrics.workerHealth(inst.id, h)
	a.mu.Lock()
	inst.running, inst.queued, inst.freeBlocks = int(h.Running), int(h.Queued), int(h.FreeBlocks)
	ready := inst.ready
	a.mu.Unlock()
	progressed := last.moved(h)
	if ready && h.Running > 0 && progressed {
		return true, true, 0
	}
	return false, h.Running+h.Queued > 0, canaryAllowance(h)
}

// progressed reports whether the worker answers and computed anything
// since last (which it updates), or is still within one of its steps: its
// counters move only when a step ends, and under CPU starvation one step
// can outlast a canary's allowance. A worker that does not answer, or
// whose counters stood still for two of its longest recent steps (plus
// canary_timeout), has not progressed.
func (a *Agent) progressed(ctx context.Context, c *workerclient.Client, last *progress) bool {
	hctx, cancel := context.WithTimeout(ctx, time.Duration(a.opts.CanaryTimeout))
	h, err := c.Health(hctx)
	cancel()
	if err != nil {
		return false
	}
	if last.moved(h) {
		return true
	}
	step := time.Duration(min(h.StepTimeUs, uint64(maxCanaryAllowance/time.Microsecond))) * time.Microsecond
	return h.Running > 0 && time.Since(last.at) < 2*step+time.Duration(a.opts.CanaryTimeout)
}

// errCanaryRefused is a canary the worker refused as overloaded: the
// previous canary is still in its engine, queued behind a step.
var errCanaryRefused = errors.New("canary refused: the previous canary is still running")

// waitedBehindWork reports whether a canary failed the way a busy, healthy
// worker can fail it: too slow, or refused while the previous one still
// waits behind a step. Wrong frames are never excused.
func waitedBehindWork(reason string, err error) bool {
	return reason == controlapi.ReasonCanaryTimeout || errors.Is(err, errCanaryRefused)
}

// canaryAllowance is how much longer than canary_timeout a canary may
// take on a worker in the state h: nothing on an idle worker; on a busy
// one, the step the canary queues behind and each of its own steps (one
// per token; traffic shares them), at the worker's recent step time. A
// stuck worker gains at most a bounded delay: its steps never end, so its
// canary still times out.
func canaryAllowance(h *wire.HealthReply) time.Duration {
	if h.Running+h.Queued == 0 {
		return 0
	}
	// Bounded before it is multiplied: a report never overflows.
	step := time.Duration(min(h.StepTimeUs, uint64(maxCanaryAllowance.Microseconds()))) * time.Microsecond
	return min(time.Duration(canaryTokens+1)*step, maxCanaryAllowance)
}

// canary runs one canary generation and checks every frame; it may take
// canary_timeout plus allowance.
func (a *Agent) canary(ctx context.Context, c *workerclient.Client, id string, gen uint64, allowance time.Duration) (string, error) {
	limit := time.Duration(a.opts.CanaryTimeout) + allowance
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	s, err := c.Generate(cctx, &wire.Generate{RequestId: fmt.Sprintf("canary-%s-%d", id, time.Now().UnixNano()), Prompt: "canary",
		MaxTokens: canaryTokens, IgnoreEos: true, Lane: wire.Lane_CANARY})
	if err != nil {
		return classify(cctx, err, limit)
	}
	seq := 0
	for {
		f, err := s.Next()
		if err != nil {
			return classify(cctx, err, limit)
		}
		if f.Error != nil {
			if f.Error.Code == wire.Code_OVERLOADED {
				return controlapi.ReasonCanaryError, fmt.Errorf("%w: %s", errCanaryRefused, f.Error.Message)
			}
			return controlapi.ReasonCanaryError, fmt.Errorf("canary: %s", f.Error.Message)
		}
		if f.FinishReason != "" {
			if seq != canaryTokens || f.FinishReason != "length" {
				return controlapi.ReasonCanaryError, fmt.Errorf("canary ended %q after %d tokens", f.FinishReason, seq)
			}
			return "", nil
		}
		seq++
		if int(f.SequenceNo) != seq || f.Generation < gen {
			return controlapi.ReasonCanaryError, fmt.Errorf("canary frame %d: sequence %d generation %d", seq, f.SequenceNo, f.Generation)
		}
	}
}

func classify(ctx context.Context, err error, limit time.Duration) (string, error) {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return controlapi.ReasonCanaryTimeout, fmt.Errorf("canary timed out after %v: %w", limit, err)
	}
	return controlapi.ReasonCanaryError, err
}

// canaryResult applies a canary's outcome; it reports whether the loop
// should go on.
func (a *Agent) canaryResult(inst *instance, gen uint64, reason string, err error, proc *os.Process) bool {
	a.mu.Lock()
	if inst.pid != proc.Pid {
		a.mu.Unlock()
		return false // that worker is gone
	}
	gen = inst.gen
	wasReady := inst.ready
	if err == nil && (inst.spec.onFaultedGPU(a.gpuFaults) || inst.draining) {
		// The canary passes on the CPU engine, but the node has a critical
		// GPU error: it stays not ready until the agent restarts. A
		// draining instance stays not ready until undrain.
		a.mu.Unlock()
		return true
	}
	if err == nil {
		inst.ready, inst.notReady, inst.canaryFail = true, "", 0
		a.mu.Unlock()
		a.metrics.canary.WithLabelValues("ok").Inc()
		if !wasReady {
			a.emit(controlapi.Event{Kind: controlapi.EventReady, InstanceID: inst.id, Generation: gen})
			a.registerAll(context.Background())
		}
		return true
	}
	inst.ready, inst.notReady = false, reason
	inst.canaryFail++
	fails := inst.canaryFail
	a.mu.Unlock()
	a.metrics.canary.WithLabelValues(reason).Inc()
	a.emit(controlapi.Event{Kind: controlapi.EventNotReady, InstanceID: inst.id, Generation: gen, Reason: reason, Detail: err.Error()})
	a.log.Warn("canary failed", "instance_id", inst.id, "generation", gen, "failure_reason", reason, "err", err, "attempt", fails)
	a.registerAll(context.Background())
	if fails >= a.opts.CanaryFailures {
		a.log.Error("canary failures past threshold", "instance_id", inst.id, "generation", gen, "recovery_action", "restart")
		proc.Kill()
		return false
	}
	return true
}
