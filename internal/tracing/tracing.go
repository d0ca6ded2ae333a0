// Package tracing is the OpenTelemetry setup every Lifeline process
// shares: a tracer provider whose finished spans are kept in a bounded
// ring in memory (served as JSON at /debug/traces on the process's
// private debug socket, which the drill report reads) and, when an OTLP endpoint
// is configured, exported over OTLP/gRPC in batches.
package tracing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/lifeline-llm/lifeline/internal/debugsock"
	"go.opentelemetry.io/otel/trace/noop"
)

// RingSpans bounds the finished spans a process keeps in memory.
const RingSpans = 4096

// Options configure a process's tracing.
type Options struct {
	// Service is the OpenTelemetry service name (lifeline-frontend,
	// lifeline-agent); Instance its service.instance.id.
	Service, Instance string
	// Endpoint is an OTLP/gRPC collector (host:port). Empty: the
	// standard OTEL_EXPORTER_OTLP_ENDPOINT / _TRACES_ENDPOINT variables,
	// and without them nothing is exported (the ring still keeps spans).
	Endpoint string
	// Insecure speaks plaintext to the collector (a local agent); else TLS.
	Insecure bool
}

// Tracing is a process's tracer provider and its ring of finished spans.
type Tracing struct {
	provider *sdktrace.TracerProvider
	ring     *ring
	// Exporting says whether spans also go to an OTLP collector.
	Exporting bool
}

// New sets a process's tracing up.
func New(o Options) (*Tracing, error) {
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName(o.Service), semconv.ServiceInstanceID(o.Instance)))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	t := &Tracing{ring: &ring{max: RingSpans}}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithSpanProcessor(t.ring)}
	if o.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		var eo []otlptracegrpc.Option
		if o.Endpoint != "" {
			eo = append(eo, otlptracegrpc.WithEndpoint(o.Endpoint))
		}
		if o.Insecure {
			eo = append(eo, otlptracegrpc.WithInsecure())
		}
		// The client connects lazily: a collector that is down loses
		// spans, never holds a request.
		exp, err := otlptracegrpc.New(context.Background(), eo...)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(time.Second)))
		t.Exporting = true
	}
	t.provider = sdktrace.NewTracerProvider(opts...)
	return t, nil
}

// Tracer is the process's tracer for name (its package).
func (t *Tracing) Tracer(name string) trace.Tracer {
	if t == nil {
		return noop.NewTracerProvider().Tracer(name)
	}
	return t.provider.Tracer(name)
}

// Shutdown flushes the exporter (within ctx) and stops tracing.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Span is a finished span as /debug/traces serves it.
type Span struct {
	TraceID  string            `json:"trace_id"`
	SpanID   string            `json:"span_id"`
	ParentID string            `json:"parent_id,omitempty"`
	Name     string            `json:"name"`
	Start    time.Time         `json:"start"`
	End      time.Time         `json:"end"`
	Attrs    map[string]string `json:"attributes,omitempty"`
	Events   []Event           `json:"events,omitempty"`
	// Error is the span's error status description ("" when it ended
	// well).
	Error string `json:"error,omitempty"`
}

// Event is a point in a span.
type Event struct {
	Name  string            `json:"name"`
	At    time.Time         `json:"at"`
	Attrs map[string]string `json:"attributes,omitempty"`
}

// Spans returns the ring's spans whose attribute key has value (every
// span when key is ""), oldest first, at most limit (0: all).
func (t *Tracing) Spans(key, value string, limit int) []Span {
	return t.ring.spans(key, value, limit)
}

// Handler serves GET /debug/traces?attr=KEY&value=V&limit=N (for example
// attr=request_id): the matching finished spans as a JSON array.
func (t *Tracing) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		limit := 0
		if s := q.Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				http.Error(w, "tracing: limit: want a number ≥ 0", http.StatusBadRequest)
				return
			}
			limit = n
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(t.Spans(q.Get("attr"), q.Get("value"), limit))
	})
}

// ring is a span processor that keeps the last max finished spans.
type ring struct {
	mu   sync.Mutex
	max  int
	buf  []Span
	next int
}

func (r *ring) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (r *ring) Shutdown(context.Context) error                  { return nil }
func (r *ring) ForceFlush(context.Context) error                { return nil }

func (r *ring) OnEnd(s sdktrace.ReadOnlySpan) {
	sp := Span{TraceID: s.SpanContext().TraceID().String(), SpanID: s.SpanContext().SpanID().String(),
		Name: s.Name(), Start: s.StartTime(), End: s.EndTime(), Attrs: attrs(s.Attributes())}
	if p := s.Parent(); p.IsValid() {
		sp.ParentID = p.SpanID().String()
	}
	if st := s.Status(); st.Code == codes.Error {
		sp.Error = st.Description
		if sp.Error == "" {
			sp.Error = "error"
		}
	}
	for _, e := range s.Events() {
		sp.Events = append(sp.Events, Event{Name: e.Name, At: e.Time, Attrs: attrs(e.Attributes)})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buf) < r.max {
		r.buf = append(r.buf, sp)
	} else {
		r.buf[r.next] = sp
	}
	r.next = (r.next + 1) % r.max
}

func (r *ring) spans(key, value string, limit int) []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []Span{}
	n := len(r.buf)
	for i := range n {
		// Oldest first: the oldest is at next (0 until the ring is full).
		sp := r.buf[(r.next+i)%n]
		if key == "" || sp.Attrs[key] == value {
			out = append(out, sp)
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out
}

func attrs(kvs []attribute.KeyValue) map[string]string {
	if len(kvs) == 0 {
		return nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// ErrNoTraces is returned by Fetch when the page is not there.
var ErrNoTraces = errors.New("tracing: no /debug/traces")

// Fetch reads the spans whose attribute key has value from a process's
// debug socket (base "unix:PATH", see debugsock) or an http base.
func Fetch(ctx context.Context, base, key, value string) ([]Span, error) {
	q := url.Values{"attr": {key}, "value": {value}}
	c, prefix := debugsock.Client(base)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, prefix+"/debug/traces?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w at %s: %s", ErrNoTraces, base, resp.Status)
	}
	var out []Span
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("tracing: %s: %w", base, err)
	}
	return out, nil
}
