package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/lifeline-llm/lifeline/internal/pki"
)

// createInstances makes every configured instance, before the control
// socket serves (an undrain must find them); on a node that is drained
// (it was before the agent restarted) they stay stopped until undrain.
// It returns those to start.
func (a *Agent) createInstances() []*instance {
	a.mu.Lock()
	defer a.mu.Unlock()
	drained := a.drain != nil
	var start []*instance
	for _, spec := range a.opts.Instances {
		for k := 0; k < spec.Count; k++ {
			inst := &instance{id: instanceID(a.opts.NodeID, spec, k), spec: spec, state: "starting",
				reset: make(chan struct{}, 1)}
			if drained {
				// The last generation it had, for nodectl status: undrain
				// starts it at a higher one.
				inst.gen, _ = a.localGeneration(inst.id)
				inst.draining, inst.state, inst.notReady = true, "drained", "drained"
			} else {
				start = append(start, inst)
			}
			a.instances[inst.id] = inst
		}
	}
	return start
}

// startSupervision routes the detector's reports and starts one
// supervisor per instance of start.
func (a *Agent) startSupervision(ctx context.Context, start []*instance) {
	a.track(func() { a.dispatchExits(ctx) })
	for _, inst := range start {
		a.startInstance(inst)
	}
}

// supervise keeps one instance running: a new generation for every start,
// restarts with exponential backoff, and a crash-loop limit after which
// the instance cools down (exponentially longer for every crash loop in a
// row) before it is tried again.
func (a *Agent) supervise(ctx context.Context, inst *instance) {
	h := newRestartHistory(&a.opts)
	rec, ok := a.adoptable(inst.id)
	if inst.spec.ranks() > 1 {
		if ok {
			a.endOrphanGroup(inst, rec)
		}
		a.sweepSegments(inst)
		ok = false
	}
	keep := 0
	if ok {
		keep = rec.PID
	}
	a.endStrays(inst, keep)
	if ok {
		if !a.adopt(ctx, inst, rec) {
			// Not watched, so not ours: it must not run beside its
			// successor.
			a.endStrays(inst, 0)
		}
		if ctx.Err() != nil || a.drained(inst) {
			return
		}
	}
	for ctx.Err() == nil {
		started := time.Now()
		_, err := a.runOnce(ctx, inst)
		if ctx.Err() != nil || a.drained(inst) {
			return
		}
		if errors.Is(err, errNoGeneration) {
			// etcd unreachable: not the worker's fault, not a crash. Wait
			// for etcd, without giving up on the instance.
			a.setState(inst, "waiting_for_etcd")
			hint, _ := pki.EtcdHint(err, a.opts.Etcd, a.opts.CertDir, pki.Agent(a.opts.NodeID))
			if hint == nil {
				hint = err
			}
			a.log.Warn("cannot get a generation from etcd", "instance_id", inst.id, "err", hint, "recovery_action", "retry")
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
		backoff, cooldown := h.exited(started, time.Now())
		if cooldown > 0 {
			if !a.coolDown(ctx, inst, h, cooldown) {
				return
			}
		} else {
			a.setState(inst, "restarting")
			jitter := time.Duration(rand.Int64N(int64(backoff)/5 + 1))
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff + jitter):
			}
		}
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

// drained reports whether a drain holds inst: a worker of a draining node
// that dies is not restarted (the drain stops the instance anyway).
func (a *Agent) drained(inst *instance) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if inst.draining {
		inst.state = "drained"
	}
	return inst.draining
}

// instanceID names instance k of spec on node: <node>-<role>-<model>-k,
// model the preset or the GGUF model's label, with -tp<n> before k for a
// tensor-parallel group.
func instanceID(node string, spec InstanceSpec, k int) string {
	if spec.ranks() > 1 {
		return fmt.Sprintf("%s-%s-%s-tp%d-%d", node, spec.Role, spec.label(), spec.ranks(), k)
	}
	return fmt.Sprintf("%s-%s-%s-%d", node, spec.Role, spec.label(), k)
}
