package tracing

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// TestRingKeepsTheLastSpans: the ring keeps the newest RingSpans spans,
// oldest first, with parents, attributes, events and error status, and
// filters them by an attribute.
func TestRingKeepsTheLastSpans(t *testing.T) {
	tr, err := New(Options{Service: "test", Instance: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown(context.Background())
	tracer := tr.Tracer("test")
	ctx, root := tracer.Start(context.Background(), "request")
	root.SetAttributes(attribute.String("request_id", "r1"))
	_, child := tracer.Start(ctx, "decode")
	child.SetAttributes(attribute.String("request_id", "r1"), attribute.Int("decode_attempt", 1))
	child.AddEvent("first_token")
	child.SetStatus(codes.Error, "worker died")
	child.End()
	root.End()
	for i := range RingSpans + 10 {
		_, s := tracer.Start(context.Background(), fmt.Sprintf("filler-%d", i))
		s.End()
	}
	all := tr.Spans("", "", 0)
	if len(all) != RingSpans || all[0].Name != "filler-10" || all[len(all)-1].Name != fmt.Sprintf("filler-%d", RingSpans+9) {
		t.Fatalf("%d spans, first %q last %q", len(all), all[0].Name, all[len(all)-1].Name)
	}
	// Spans of a request, before the ring overwrote them.
	tr2, _ := New(Options{Service: "test"})
	defer tr2.Shutdown(context.Background())
	tracer = tr2.Tracer("test")
	ctx, root = tracer.Start(context.Background(), "request")
	root.SetAttributes(attribute.String("request_id", "r1"))
	_, child = tracer.Start(ctx, "decode")
	child.SetAttributes(attribute.String("request_id", "r1"))
	child.AddEvent("first_token")
	child.SetStatus(codes.Error, "worker died")
	child.End()
	root.End()
	_, other := tracer.Start(context.Background(), "request")
	other.SetAttributes(attribute.String("request_id", "r2"))
	other.End()
	got := tr2.Spans("request_id", "r1", 0)
	if len(got) != 2 || got[0].Name != "decode" || got[1].Name != "request" {
		t.Fatalf("spans of r1: %+v", got)
	}
	if got[0].ParentID != got[1].SpanID || got[0].TraceID != got[1].TraceID || got[0].Error != "worker died" ||
		len(got[0].Events) != 1 || got[0].Events[0].Name != "first_token" || got[1].Error != "" {
		t.Fatalf("decode span %+v, root %+v", got[0], got[1])
	}
	if last := tr2.Spans("", "", 1); len(last) != 1 || last[0].Attrs["request_id"] != "r2" {
		t.Fatalf("limit 1: %+v", last)
	}
	// Served as JSON, and read back by Fetch.
	srv := httptest.NewServer(tr2.Handler())
	defer srv.Close()
	fetched, err := Fetch(context.Background(), srv.URL, "request_id", "r1")
	if err != nil || len(fetched) != 2 || fetched[0].SpanID != got[0].SpanID {
		t.Fatalf("fetched %+v %v", fetched, err)
	}
	resp, err := http.Get(srv.URL + "/debug/traces?limit=x")
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad limit: %v %v", resp, err)
	}
	resp.Body.Close()
}

// collector is an OTLP/gRPC trace receiver.
type collector struct {
	coltrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names []string
}

func (c *collector) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.names = append(c.names, service+"/"+s.Name)
			}
		}
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// TestExportsOverOTLP: with an endpoint, finished spans reach a real
// OTLP/gRPC receiver, named by service, within the batch timeout; the
// ring keeps them too.
func TestExportsOverOTLP(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	col := &collector{}
	coltrace.RegisterTraceServiceServer(gs, col)
	go gs.Serve(ln)
	defer gs.Stop()
	tr, err := New(Options{Service: "lifeline-test", Instance: "t1", Endpoint: ln.Addr().String(), Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Exporting {
		t.Fatal("not exporting with an endpoint")
	}
	_, s := tr.Tracer("test").Start(context.Background(), "migration")
	s.End()
	deadline := time.Now().Add(10 * time.Second)
	for {
		col.mu.Lock()
		names := append([]string(nil), col.names...)
		col.mu.Unlock()
		if len(names) == 1 && names[0] == "lifeline-test/migration" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector got %v", names)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := tr.Spans("", "", 0); len(got) != 1 {
		t.Fatalf("ring: %+v", got)
	}
}

// TestCollectorDownHoldsNothing: with the collector's port closed, spans
// still end at once (the exporter batches them away from the caller) and
// stay in the ring; Shutdown gives up within its context.
func TestCollectorDownHoldsNothing(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	tr, err := New(Options{Service: "lifeline-test", Endpoint: dead, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	tracer := tr.Tracer("test")
	start := time.Now()
	for i := range 1000 {
		_, s := tracer.Start(context.Background(), fmt.Sprintf("span-%d", i))
		s.End()
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("1,000 spans took %v to end with the collector down", took)
	}
	if got := len(tr.Spans("", "", 0)); got != 1000 {
		t.Errorf("ring holds %d spans, want 1000", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start = time.Now()
	tr.Shutdown(ctx)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Shutdown took %v past its 1 s context", took)
	}
}
