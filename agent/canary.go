package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
)

// canaryTokens is how many tokens a canary asks for; every chunk is checked.
const canaryTokens = 4

// canaryLoop runs a real generation on the instance's canary lane: once at
// start (an instance is ready only after one passes), then whenever the
// instance has been idle for CanaryIdle ±20%. A failure makes the instance
// not ready; CanaryFailures in a row kill it for a restart.
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
	var lastGenerated uint64
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
			c, err := workerclient.Dial(dctx, addr, a.tlsConf, inst.id, gen)
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
		hctx, hcancel := context.WithTimeout(ctx, time.Duration(a.opts.CanaryTimeout))
		h, herr := client.Health(hctx)
		hcancel()
		if herr == nil {
			a.mu.Lock()
			inst.running, inst.queued, inst.freeBlocks = int(h.Running), int(h.Queued), int(h.FreeBlocks)
			ready := inst.ready
			a.mu.Unlock()
			// Busy and making progress: the traffic is the liveness proof.
			// Busy without a single new token since the last look: the
			// engine may be wedged, so run the canary (its lane does not
			// queue behind that traffic).
			progressed := h.TokensGenerated != lastGenerated
			lastGenerated = h.TokensGenerated
			if ready && h.Running > 0 && progressed {
				continue
			}
		}
		reason, err := a.canary(ctx, client, inst.id, gen)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			closeClient()
		}
		if !a.canaryResult(inst, gen, reason, err, proc) {
			return
		}
	}
}

// canary runs one canary generation and checks every frame.
func (a *Agent) canary(ctx context.Context, c *workerclient.Client, id string, gen uint64) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Duration(a.opts.CanaryTimeout))
	defer cancel()
	s, err := c.Generate(cctx, &wire.Generate{RequestId: fmt.Sprintf("canary-%s-%d", id, time.Now().UnixNano()), Prompt: "canary",
		MaxTokens: canaryTokens, IgnoreEos: true, Lane: wire.Lane_CANARY})
	if err != nil {
		return classify(cctx, err)
	}
	seq := 0
	for {
		f, err := s.Next()
		if err != nil {
			return classify(cctx, err)
		}
		if f.Error != nil {
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

func classify(ctx context.Context, err error) (string, error) {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return controlapi.ReasonCanaryTimeout, fmt.Errorf("canary timed out: %w", err)
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
	if err == nil && a.gpuFault {
		// The canary passes on the CPU engine, but the node has a critical
		// GPU error: it stays not ready until the agent restarts.
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
