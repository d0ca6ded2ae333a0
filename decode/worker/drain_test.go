package worker

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// startWorker runs a paced worker of the tiny preset (a long generation
// takes seconds, as small's does, at a fraction of its CPU) in-process
// and dials it.
func startWorker(t *testing.T) *workerclient.Client {
	c, _ := startStoppableWorker(t)
	return c
}

// startStoppableWorker is startWorker that also returns how to stop the
// worker as its SIGTERM does (its context ends); stop waits for Run to
// return and reports its error.
func startStoppableWorker(t *testing.T) (*workerclient.Client, func() error) {
	t.Helper()
	w := newTestWorker(t)
	return w.dial(t), w.stop
}

// testWorker is an in-process worker: by default tiny, a step every
// clustertest.PacedStep.
type testWorker struct {
	addr    string
	tlsConf *tls.Config
	// stop stops the worker as its SIGTERM does (its context ends), waits
	// for Run to return and reports its error.
	stop func() error
}

func newTestWorker(t *testing.T) *testWorker {
	t.Helper()
	return newTestWorkerWith(t, decode.Options{Preset: "tiny", WeightSeed: 1, StepInterval: clustertest.PacedStep})
}

// newTestWorkerWith is newTestWorker with the engine options eopts.
func newTestWorkerWith(t *testing.T, eopts decode.Options) *testWorker {
	t.Helper()
	root := t.TempDir()
	certs, err := pki.InitIdentity(root, pki.Worker("test", "w"))
	if err != nil {
		t.Fatal(err)
	}
	clientCerts, err := pki.InitIdentity(root, pki.Frontend("test"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{InstanceID: "w", Generation: 1, Role: "decode", Listen: "127.0.0.1:0", CertDir: certs,
			Engine: eopts}, pw)
		pw.Close()
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
	tlsConf, err := workerclient.ClientTLS(clientCerts)
	if err != nil {
		t.Fatal(err)
	}
	return &testWorker{addr: r.Addr, tlsConf: tlsConf, stop: stop}
}

// dial connects a client, closed by the test's cleanup.
func (w *testWorker) dial(t *testing.T) *workerclient.Client {
	t.Helper()
	c, err := workerclient.Dial(context.Background(), w.addr, w.tlsConf, "w", 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestWorkerDrain: a draining worker that no longer accepts refuses new
// requests with a retryable DRAINING error, counts and reports what it
// serves, and at the drain's deadline ends what is in flight with a
// retryable DRAINING error after the tokens it already sent; canaries
// still run.
func TestWorkerDrain(t *testing.T) {
	t.Parallel()
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
	if fs := clustertest.CollectFrames(t, canary); fs[len(fs)-1].FinishReason != "length" {
		t.Fatalf("canary while draining: %+v", fs[len(fs)-1])
	}
	if _, err := c.AdminWith(ctx, &wire.Admin{InstanceId: "w", CurrentGeneration: 1, Draining: true, EndInFlight: true}); err != nil {
		t.Fatal(err)
	}
	fs := clustertest.CollectFrames(t, s)
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

// TestWorkerDrainDecides: told the drain's deadline, a worker lets a
// request whose remaining tokens fit before it (at its step time, with the
// margin) finish here, and ends at once, with a retryable DRAINING error
// after the tokens it sent, one that cannot; its health counts both.
func TestWorkerDrainDecides(t *testing.T) {
	t.Parallel()
	c := startWorker(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := func(id string, n int32) *workerclient.Stream {
		s, err := c.Generate(ctx, &wire.Generate{RequestId: id, Prompt: "Once", MaxTokens: n, IgnoreEos: true, Lane: wire.Lane_BATCH})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Next(); err != nil {
			t.Fatal(err)
		}
		return s
	}
	long, short := start("long", 3000), start("short", 30)
	h, err := c.Health(ctx)
	if err != nil || h.MeanStepTimeUs == 0 {
		t.Fatalf("health: %+v %v", h, err)
	}
	// Room for 300 tokens at the margin: the short one (29 left) fits
	// unless steps get ten times slower, the long one (~3000) does not
	// unless they get ten times faster. The drain decides with the mean.
	step := time.Duration(h.MeanStepTimeUs) * time.Microsecond
	t.Logf("step time %v", step)
	deadline := time.Now().Add(time.Duration(float64(step) * 300 * 1.5))
	h, err = c.AdminWith(ctx, &wire.Admin{InstanceId: "w", CurrentGeneration: 1, Draining: true, DrainDeadlineUnixMs: deadline.UnixMilli()})
	if err != nil || h.DrainMovedEarly != 1 {
		t.Fatalf("health after the deadline was given (step %v): %+v %v", step, h, err)
	}
	fs := clustertest.CollectFrames(t, long)
	last := fs[len(fs)-1]
	if last.FinishReason != "error" || last.Error.GetCode() != wire.Code_DRAINING || !last.Error.GetRetryable() ||
		!strings.Contains(last.Error.GetMessage(), "cannot finish before") {
		t.Fatalf("long request ended %+v", last)
	}
	if len(fs) > 1000 {
		t.Fatalf("long request ran on for %d tokens", len(fs))
	}
	fs = clustertest.CollectFrames(t, short)
	if last := fs[len(fs)-1]; last.FinishReason != "length" || int(fs[len(fs)-2].SequenceNo) != 30 {
		t.Fatalf("short request ended %+v", last)
	}
	if h, err := c.Health(ctx); err != nil || h.InFlight != 0 || h.DrainMovedEarly != 1 || h.DrainFinishedInPlace != 1 {
		t.Fatalf("health after both ended: %+v %v", h, err)
	}
}
