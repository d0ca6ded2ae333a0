package agent

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/lifeline-llm/lifeline/ebpf"
)

// The agent's spans: a worker's death (from the kernel's exit time to the
// failure announced: detected, KV reclaimed, deregistered, announced), a
// worker's start (generation, process, ready), and a drain with a span
// per step. Every span carries node_id and, for a worker, instance_id and
// generation; /debug/traces on the metrics listener serves them.

func (a *Agent) nodeAttr() attribute.KeyValue { return attribute.String("node_id", a.opts.NodeID) }

func workerAttrs(id string, gen uint64) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String("instance_id", id), attribute.Int64("generation", int64(gen))}
}

// trc is the agent's tracer (a no-op one for an agent built without).
func (a *Agent) trc() trace.Tracer {
	if a.tracer == nil {
		return noop.NewTracerProvider().Tracer("")
	}
	return a.tracer
}

// deathSpan opens the span of a worker's death at its exit time.
func (a *Agent) deathSpan(id string, gen uint64, ex ebpf.Exit) trace.Span {
	_, s := a.trc().Start(a.traceCtx(), "lifeline.worker_death", trace.WithTimestamp(ex.DetectedAt),
		trace.WithAttributes(append(workerAttrs(id, gen), a.nodeAttr(), attribute.Int("pid", ex.PID),
			attribute.String("detector", ex.Detector), attribute.Int("signal", ex.Signal), attribute.Bool("oom", ex.OOM))...))
	s.AddEvent("exit", trace.WithTimestamp(ex.DetectedAt))
	s.AddEvent("detected")
	return s
}

// startSpan opens the span of a worker's start; workerReady ends it.
func (a *Agent) startSpan(inst *instance) trace.Span {
	a.mu.Lock()
	restarts := inst.restarts
	a.mu.Unlock()
	_, s := a.trc().Start(a.traceCtx(), "lifeline.worker_start", trace.WithAttributes(attribute.String("instance_id", inst.id),
		a.nodeAttr(), attribute.String("role", inst.spec.Role), attribute.Int("restarts", restarts)))
	return s
}

// drainStep runs one step of a drain under a span of its own.
func (a *Agent) drainStep(ctx context.Context, name string, step func()) {
	_, s := a.trc().Start(ctx, "lifeline.drain."+name, trace.WithAttributes(a.nodeAttr()))
	defer s.End()
	step()
}

// endSpan ends s, as an error when why is not "".
func endSpan(s trace.Span, why string) {
	if why != "" {
		s.SetStatus(codes.Error, why)
	}
	s.End()
}

// traceCtx is the context the agent's root spans start from.
func (a *Agent) traceCtx() context.Context {
	if a.life != nil {
		return a.life
	}
	return context.Background()
}
