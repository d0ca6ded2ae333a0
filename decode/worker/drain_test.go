package worker

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// startWorker runs a worker of the small preset (a long generation takes
// seconds) in-process and dials it.
func startWorker(t *testing.T) *workerclient.Client {
	c, _ := startStoppableWorker(t)
	return c
}

// startStoppableWorker is startWorker that also returns how to stop the
// worker as its SIGTERM does (its context ends); stop waits for Run to
// return and reports its error.
func startStoppableWorker(t *testing.T) (*workerclient.Client, func() error) {
	t.Helper()
	certs := filepath.Join(t.TempDir(), "certs")
	if err := pki.Init(certs, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{InstanceID: "w", Generation: 1, Role: "decode", Listen: "127.0.0.1:0", CertDir: certs,
			Engine: decode.Options{Preset: "small", WeightSeed: 1}}, pw)
	}()
	var stopErr error
	stopped := false
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			stopErr = <-done
		}
		return stopErr
	}
	t.Cleanup(func() {
		cancel()
		pr.Close()
		stop()
	})
	var r workerclient.Ready
	if err := json.NewDecoder(pr).Decode(&r); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, pr)
	tlsConf, err := workerclient.ClientTLS(certs)
	if err != nil {
		t.Fatal(err)
	}
	c, err := workerclient.Dial(context.Background(), r.Addr, tlsConf, "w", 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, stop
}

// TestWorkerDrain: a draining worker that no longer accepts refuses new
// requests with a retryable DRAINING error, counts and reports what it
// serves, and at the drain's deadline ends what is in flight with a
// retryable DRAINING error after the tokens it already sent; canaries
// still run.
func TestWorkerDrain(t *testing.T) {
	c := startWorker(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := c.Generate(ctx, &wire.Generate{RequestId: "long", Prompt: "Once", MaxTokens: 500, IgnoreEos: true, Lane: wire.Lane_BATCH})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	h, err := c.AdminWith(ctx, &wire.Admin{InstanceId: "w", CurrentGeneration: 1, Accepting: false, Draining: true})
	if err != nil {
		t.Fatal(err)
	}
	if h.InFlight != 1 || h.RequestsStarted != 1 || h.Accepting {
		t.Fatalf("health while draining: %+v", h)
	}
	refused, err := c.Generate(ctx, &wire.Generate{RequestId: "new", Prompt: "hi", MaxTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	if f, err := refused.Next(); err != nil || f.Error.GetCode() != wire.Code_DRAINING || !f.Error.GetRetryable() {
		t.Fatalf("new request while draining: %+v %v", f, err)
	}
	canary, err := c.Generate(ctx, &wire.Generate{RequestId: "canary", Prompt: "canary", MaxTokens: 4, IgnoreEos: true, Lane: wire.Lane_CANARY})
	if err != nil {
		t.Fatal(err)
	}
	if fs := collect(t, canary); fs[len(fs)-1].FinishReason != "length" {
		t.Fatalf("canary while draining: %+v", fs[len(fs)-1])
	}
	if _, err := c.AdminWith(ctx, &wire.Admin{InstanceId: "w", CurrentGeneration: 1, Draining: true, EndInFlight: true}); err != nil {
		t.Fatal(err)
	}
	fs := collect(t, s)
	last := fs[len(fs)-1]
	if last.FinishReason != "error" || last.Error.GetCode() != wire.Code_DRAINING || !last.Error.GetRetryable() {
		t.Fatalf("in-flight request at the drain's deadline ended %+v", last)
	}
	for i, f := range fs[:len(fs)-1] {
		if int(f.SequenceNo) != i+2 {
			t.Fatalf("frame %d: sequence %d", i, f.SequenceNo)
		}
	}
	if h, err := c.Health(ctx); err != nil || h.InFlight != 0 || h.RequestsStarted != 1 {
		t.Fatalf("health after the forced end: %+v %v", h, err)
	}
}

// collect reads a stream to its end (its request's context bounds it).
func collect(t *testing.T, s *workerclient.Stream) []*wire.Frame {
	t.Helper()
	var fs []*wire.Frame
	for {
		f, err := s.Next()
		if errors.Is(err, io.EOF) {
			return fs
		}
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
	}
}
