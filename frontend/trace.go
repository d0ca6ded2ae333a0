package frontend

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/route"
)

// reqTrace is one request's spans: the request itself, and under it each
// prefill, KV transfer and decode attempt, and each migration (from the
// failure seen, through the epoch bump, the route and the re-prefill, to
// the first token after it). Every span carries the request id, so a
// process's /debug/traces can be asked for one request's. Its methods are
// called from the request's interpreter goroutine only; a nil reqTrace
// records nothing.
type reqTrace struct {
	tracer trace.Tracer
	ctx    context.Context
	id     attribute.KeyValue
	root   trace.Span

	decode, prefill, transfer, migration trace.Span
}

// startTrace opens r's request span.
func (s *Server) startTrace(r *reqfsm.Request, body CompletionRequest) *reqTrace {
	if s.tracer == nil {
		return nil
	}
	t := &reqTrace{tracer: s.tracer, id: attribute.String("request_id", r.ID)}
	t.ctx, t.root = s.tracer.Start(s.ctx, "lifeline.request", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(t.id,
		attribute.String("frontend_id", s.opts.ID), attribute.String("model", body.Model),
		attribute.String("priority", route.PriorityOf(body.Priority)), attribute.Int("max_tokens", r.MaxTokens),
		attribute.Int("prompt_tokens", len(r.Prompt))))
	return t
}

func (t *reqTrace) start(name string, attrs ...attribute.KeyValue) trace.Span {
	_, s := t.tracer.Start(t.ctx, name, trace.WithAttributes(append(attrs, t.id)...))
	return s
}

// end ends *s (if open) with err as its error ("" for a good end).
func end(s *trace.Span, err string) {
	if *s == nil {
		return
	}
	if err != "" {
		(*s).SetStatus(codes.Error, err)
	}
	(*s).End()
	*s = nil
}

func endpointAttrs(e reqfsm.Endpoint, epoch uint64) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String("instance_id", e.InstanceID), attribute.Int64("generation", int64(e.Generation)),
		attribute.Int64("request_epoch", int64(epoch))}
}

// dispatched opens a decode attempt's span (a migration's re-prefill
// starts with it).
func (t *reqTrace) dispatched(d reqfsm.Dispatch, attempt int) {
	if t == nil {
		return
	}
	end(&t.decode, "")
	t.decode = t.start("lifeline.decode", append(endpointAttrs(d.To, d.Epoch), attribute.Int("decode_attempt", attempt),
		attribute.Int("sequence_no", len(d.Prefix)))...)
	if t.migration != nil {
		t.migration.AddEvent("re_prefill", trace.WithAttributes(append(endpointAttrs(d.To, d.Epoch),
			attribute.Int("replayed_tokens", len(d.Prefix)))...))
	}
}

// routed marks a route on the migration under way.
func (t *reqTrace) routed(cached int) {
	if t == nil || t.migration == nil {
		return
	}
	t.migration.AddEvent("route", trace.WithAttributes(attribute.Int("cached_blocks", cached)))
}

func (t *reqTrace) prefillSent(p reqfsm.Prefill, attempt int) {
	if t == nil {
		return
	}
	end(&t.prefill, "superseded")
	t.prefill = t.start("lifeline.prefill", append(endpointAttrs(p.At, p.Epoch), attribute.Int("prefill_attempt", attempt))...)
}

func (t *reqTrace) prefillDone(err string) {
	if t != nil {
		end(&t.prefill, err)
	}
}

func (t *reqTrace) transferSent(tr reqfsm.Transfer) {
	if t == nil {
		return
	}
	end(&t.transfer, "superseded")
	t.transfer = t.start("lifeline.kv_transfer", append(endpointAttrs(tr.To, tr.Epoch), attribute.String("from_node", tr.KV.Node),
		attribute.Int("blocks", len(tr.KV.Keys)), attribute.Int64("transfer_epoch", int64(tr.TransferEpoch)))...)
}

func (t *reqTrace) transferDone(bytes uint64, err string) {
	if t == nil || t.transfer == nil {
		return
	}
	t.transfer.SetAttributes(attribute.Int64("bytes", int64(bytes)))
	end(&t.transfer, err)
}

// migrating ends the failed decode attempt and opens the migration's
// span: the failure seen, and the epoch it moves to.
func (t *reqTrace) migrating(r *reqfsm.Request, reason string, now time.Time) {
	if t == nil {
		return
	}
	end(&t.decode, reason)
	if t.migration != nil {
		// A re-route of a migration under way: the same migration.
		t.migration.AddEvent("failure_detected", trace.WithTimestamp(now), trace.WithAttributes(attribute.String("failure_reason", reason)))
		return
	}
	t.migration = t.start("lifeline.migration", attribute.Int("migration", r.Migrations), attribute.Int("sequence_no", r.Received()),
		attribute.String("failure_reason", reason), attribute.String("recovery_action", "re-prefill elsewhere"))
	t.migration.AddEvent("failure_detected", trace.WithTimestamp(now), trace.WithAttributes(attribute.String("failure_reason", reason)))
	t.migration.AddEvent("epoch_bump", trace.WithTimestamp(now), trace.WithAttributes(attribute.Int64("request_epoch", int64(r.Epoch))))
}

// recovered ends the migration at its first token.
func (t *reqTrace) recovered(kvReused int) {
	if t == nil || t.migration == nil {
		return
	}
	t.migration.AddEvent("first_token", trace.WithAttributes(attribute.Int("kv_reused_positions", kvReused)))
	end(&t.migration, "")
}

// finished ends every open span and the request's.
func (t *reqTrace) finished(r *reqfsm.Request) {
	if t == nil {
		return
	}
	why := ""
	if r.Err != nil {
		why = fmt.Sprintf("%s: %s", r.Err.Type, r.Err.Message)
	}
	end(&t.prefill, why)
	end(&t.transfer, why)
	end(&t.migration, why)
	end(&t.decode, why)
	t.root.SetAttributes(attribute.Int("output_tokens", r.Output.Len()), attribute.Int("migrations", r.Migrations),
		attribute.String("finish_reason", r.FinishReason), attribute.Int("kv_reused_positions", r.ReusedPositions))
	end(&t.root, why)
}
