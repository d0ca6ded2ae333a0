package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// startSupervision routes the detector's reports and starts one
// supervisor per configured instance.
func (a *Agent) startSupervision(ctx context.Context) {
	a.track(func() { a.dispatchExits(ctx) })
	for _, spec := range a.opts.Instances {
		for k := 0; k < spec.Count; k++ {
			inst := &instance{id: fmt.Sprintf("%s-%s-%s-%d", a.opts.NodeID, spec.Role, spec.Preset, k), spec: spec, state: "starting"}
			a.mu.Lock()
			a.instances[inst.id] = inst
			a.mu.Unlock()
			a.track(func() { a.supervise(ctx, inst) })
		}
	}
}

// supervise keeps one instance running: a new generation for every start,
// restarts with exponential backoff, and a crash-loop limit.
func (a *Agent) supervise(ctx context.Context, inst *instance) {
	backoff := time.Duration(a.opts.RestartBackoff)
	var recent []time.Time
	if rec, ok := a.adoptable(inst.id); ok {
		a.adopt(ctx, inst, rec)
		if ctx.Err() != nil {
			return
		}
	}
	for ctx.Err() == nil {
		started := time.Now()
		_, err := a.runOnce(ctx, inst)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNoGeneration) {
			// etcd unreachable: not the worker's fault, not a crash. Wait
			// for etcd, without giving up on the instance.
			a.setState(inst, "waiting_for_etcd")
			a.log.Warn("cannot get a generation", "instance_id", inst.id, "err", err, "recovery_action", "retry")
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		if err != nil {
			a.log.Error("worker start failed", "instance_id", inst.id, "err", err, "recovery_action", "restart")
		}
		// A worker that ran for a whole window was healthy: start over.
		if time.Since(started) > time.Duration(a.opts.CrashLoopWindow) {
			backoff = time.Duration(a.opts.RestartBackoff)
			recent = recent[:0]
		}
		recent = append(recent, time.Now())
		for len(recent) > 0 && time.Since(recent[0]) > time.Duration(a.opts.CrashLoopWindow) {
			recent = recent[1:]
		}
		if len(recent) > a.opts.CrashLoopLimit {
			a.setState(inst, "crash_loop")
			a.emit(controlapi.Event{Kind: controlapi.EventCrashLoop, InstanceID: inst.id, Detail: fmt.Sprintf("%d exits within %v", len(recent), time.Duration(a.opts.CrashLoopWindow))})
			a.log.Error("crash loop: giving up on instance", "instance_id", inst.id, "recovery_action", "none")
			return
		}
		a.setState(inst, "restarting")
		jitter := time.Duration(rand.Int64N(int64(backoff)/5 + 1))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff + jitter):
		}
		backoff = min(2*backoff, time.Duration(a.opts.RestartMax))
		a.mu.Lock()
		inst.restarts++
		a.mu.Unlock()
		a.metrics.restarts.WithLabelValues(inst.id).Inc()
	}
}

func (a *Agent) setState(inst *instance, state string) {
	a.mu.Lock()
	inst.state = state
	a.mu.Unlock()
}
