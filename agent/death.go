package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/ebpf"
	"github.com/lifeline-llm/lifeline/kv"
)

// onDeath acts on a worker's death at once, without waiting for any lease:
// deregister, announce, reclaim its KV blocks.
func (a *Agent) onDeath(inst *instance, gen uint64, ex ebpf.Exit) *controlapi.Event {
	reason := controlapi.ReasonExitCode
	if !ex.OOM && ex.Signal == 9 && a.ooms.killedSince() {
		// The probes saw a SIGKILL but missed the OOM mark (its thread
		// was gone before it could be resolved): the cgroup counted it.
		ex.OOM = true
	}
	switch {
	case ex.OOM:
		reason = controlapi.ReasonOOM
	case ex.Signal != 0:
		reason = controlapi.ReasonSignal
	}
	span := a.deathSpan(inst.id, gen, ex)
	a.forgetWorker(inst.id)
	a.mu.Lock()
	if inst.starting != nil {
		endSpan(inst.starting, "exited before it was ready")
		inst.starting = nil
	}
	if r := inst.notReady; inst.canaryFail >= a.opts.CanaryFailures && (r == controlapi.ReasonCanaryTimeout || r == controlapi.ReasonCanaryError) {
		reason = r // we killed it for failing canaries
	}
	delete(a.byPID, ex.PID)
	inst.ready, inst.notReady, inst.pid, inst.canaryFail = false, "exited", 0, 0
	kvGen := inst.kvGen
	a.mu.Unlock()
	a.detector.Unwatch(ex.PID)
	// The KV blocks first: that needs no network.
	reclaimed := a.kvOwner.WriterDead(kv.Writer{Instance: inst.id, Gen: kvGen})
	span.AddEvent("kv_reclaimed", trace.WithAttributes(attribute.Int("blocks", reclaimed)))

	// The event before the etcd writes: whoever sees the deregistration
	// or the announcement finds the exit in the node's events too.
	e := a.emit(controlapi.Event{Kind: controlapi.EventExit, InstanceID: inst.id, Generation: gen, PID: ex.PID, Reason: reason, ExitCode: ex.Code,
		Signal: ex.Signal, Detector: ex.Detector, DetectedAt: ex.DetectedAt, Detail: fmt.Sprintf("%d KV blocks reclaimed", reclaimed)})
	a.mu.Lock()
	inst.lastExit = &e
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	a.deregister(ctx, inst.id, gen, reason)
	span.AddEvent("deregistered")
	a.announceFailure(ctx, schema.Failure{InstanceID: inst.id, Generation: gen, Node: a.opts.NodeID, Reason: reason,
		Detector: ex.Detector, DetectedAt: ex.DetectedAt.UnixNano()})
	span.AddEvent("failure_announced")
	span.SetAttributes(attribute.String("failure_reason", reason), attribute.String("recovery_action", "deregistered; restart"))
	endSpan(span, reason)
	a.metrics.exits.WithLabelValues(reason).Inc()
	a.metrics.detection.WithLabelValues(ex.Detector).Observe(time.Since(ex.DetectedAt).Seconds())
	a.metrics.orphans.Add(float64(reclaimed))
	a.log.Warn("worker died", "instance_id", inst.id, "generation", gen, "pid", ex.PID, "failure_reason", reason,
		"detector", ex.Detector, "recovery_action", "deregistered; restart")
	return &e
}

// deregister deletes a dead instance's registration. When the delete
// fails the registrar forgets what it wrote there, so that its next
// refresh deletes the key again.
func (a *Agent) deregister(ctx context.Context, id string, gen uint64, reason string) {
	key := schema.InstancesPrefix + id
	a.regMu.Lock()
	defer a.regMu.Unlock()
	if _, err := a.etcd.Delete(ctx, key); err != nil {
		a.reg.forget(key)
		a.etcdWriteFailed(opDeregister, err, "instance_id", id, "generation", gen, "failure_reason", reason)
		return
	}
	a.reg.deleted(key)
}

// announceFailure tells routers at once that an instance died. The record
// lives under the agent's lease: without one it is not written.
func (a *Agent) announceFailure(ctx context.Context, f schema.Failure) {
	a.mu.Lock()
	lease := a.lease
	a.mu.Unlock()
	if lease == 0 {
		return
	}
	b, _ := json.Marshal(f)
	if _, err := a.etcd.Put(ctx, schema.FailuresPrefix+f.InstanceID, string(b), clientv3.WithLease(lease)); err != nil {
		a.etcdWriteFailed(opAnnounceFailure, err, "instance_id", f.InstanceID, "generation", f.Generation, "failure_reason", f.Reason)
	}
}

// Operations counted by lifeline_agent_etcd_write_errors_total.
const (
	opRegister        = "register"
	opDeregister      = "deregister"
	opAnnounceFailure = "announce_failure"
)

// etcdWriteFailed logs and counts a failed etcd write; attrs are the
// correlation fields of what it was about.
func (a *Agent) etcdWriteFailed(op string, err error, attrs ...any) {
	a.metrics.etcdWriteErrors.WithLabelValues(op).Inc()
	a.log.Warn("etcd write failed", append([]any{"op", op, "err", err}, attrs...)...)
}
