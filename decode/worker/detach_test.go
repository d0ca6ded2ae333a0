package worker

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// seeded is a sampled generation (temperature, seed) of id at epoch,
// detachable for grace.
func seeded(id string, epoch uint64, grace time.Duration, maxTokens int32) *wire.Generate {
	return &wire.Generate{RequestId: id, RequestEpoch: epoch, Prompt: "The lighthouse keeper", MaxTokens: maxTokens,
		Temperature: 0.9, Seed: 21, IgnoreEos: true, DetachGraceMs: uint32(grace.Milliseconds())}
}

// dialAbrupt connects a client over a UDP socket of its own, with a short
// idle timeout (a connection's is the lower of both ends'), and returns
// how to kill it as a dead process dies: the socket closes and nothing
// is sent, so the worker learns of it only when the connection idles out.
func (w *testWorker) dialAbrupt(t *testing.T) (*workerclient.Client, func()) {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: pc}
	t.Cleanup(func() { pc.Close(); tr.Close() })
	addr, err := net.ResolveUDPAddr("udp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	conf := workerclient.QUICConfig()
	conf.MaxIdleTimeout, conf.KeepAlivePeriod = time.Second, 300*time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := tr.Dial(ctx, addr, w.tlsConf, conf)
	if err != nil {
		t.Fatal(err)
	}
	return workerclient.New(conn, "w", 1), func() { pc.Close() }
}

// dialDoomed is dialAbrupt; under -short, whose tests do not wait for
// an idle timeout (quic-go accepts none under 5 s), its kill closes the
// connection at once instead (CONNECTION_CLOSE: the connection is lost
// just the same, without a cancel).
func (w *testWorker) dialDoomed(t *testing.T) (*workerclient.Client, func()) {
	t.Helper()
	c, kill := w.dialAbrupt(t)
	if testing.Short() {
		return c, func() { c.Close() }
	}
	return c, kill
}

func readN(t *testing.T, s *workerclient.Stream, n int) []*wire.Frame {
	t.Helper()
	var fs []*wire.Frame
	for range n {
		f, err := s.Next()
		if err != nil {
			t.Fatalf("after %d frames: %v", len(fs), err)
		}
		if f.Error != nil {
			t.Fatalf("after %d frames: error %v", len(fs), f.Error)
		}
		fs = append(fs, f)
	}
	return fs
}

// sameFrames checks that got are want's frames (token frames and the
// finish frame) from sequence number from on, stamped with epoch.
func sameFrames(t *testing.T, got, want []*wire.Frame, from int32, epoch uint64) {
	t.Helper()
	var w []*wire.Frame
	for _, f := range want {
		if f.SequenceNo == 0 || f.SequenceNo >= from {
			w = append(w, f)
		}
	}
	if len(got) != len(w) {
		t.Fatalf("%d frames, want %d; last %+v", len(got), len(w), got[len(got)-1])
	}
	for i := range w {
		g := got[i]
		if g.SequenceNo != w[i].SequenceNo || g.TokenId != w[i].TokenId || g.Text != w[i].Text || g.FinishReason != w[i].FinishReason {
			t.Fatalf("frame %d: %+v, want %+v", i, g, w[i])
		}
		if g.RequestEpoch != epoch || g.InstanceId != "w" || g.Generation != 1 {
			t.Fatalf("frame %d stamped %s/%d epoch %d, want w/1 epoch %d", i, g.InstanceId, g.Generation, g.RequestEpoch, epoch)
		}
	}
}

// contiguous checks that fs are token frames from, from+1, … at epoch.
func contiguous(t *testing.T, fs []*wire.Frame, from int, epoch uint64) {
	t.Helper()
	for i, f := range fs {
		if int(f.SequenceNo) != from+i || f.RequestEpoch != epoch {
			t.Fatalf("frame %d: sequence %d epoch %d, want %d at %d", i, f.SequenceNo, f.RequestEpoch, from+i, epoch)
		}
	}
}

func attach(t *testing.T, ctx context.Context, c *workerclient.Client, id string, epoch uint64, from int32) *workerclient.Stream {
	t.Helper()
	s, err := c.Attach(ctx, &wire.Attach{RequestId: id, RequestEpoch: epoch, FromSequenceNo: from})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// attachOK attaches and reads the worker's acceptance (a frame of
// sequence 0, no token, no error, at the Attach's epoch).
func attachOK(t *testing.T, ctx context.Context, c *workerclient.Client, id string, epoch uint64, from int32) *workerclient.Stream {
	t.Helper()
	s := attach(t, ctx, c, id, epoch, from)
	acceptance(t, s, epoch)
	return s
}

// acceptance reads an Attach's acceptance frame.
func acceptance(t *testing.T, s *workerclient.Stream, epoch uint64) {
	t.Helper()
	f, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	if f.SequenceNo != 0 || f.Error != nil || f.FinishReason != "" || f.RequestEpoch != epoch {
		t.Fatalf("want an acceptance frame at epoch %d, got %+v", epoch, f)
	}
}

// refused reads a stream that must end with one error frame of code.
func refused(t *testing.T, s *workerclient.Stream, code wire.Code) *wire.Error {
	t.Helper()
	fs := clustertest.CollectFrames(t, s)
	if len(fs) != 1 || fs[0].Error.GetCode() != code || fs[0].FinishReason != "error" {
		t.Fatalf("want one %v error frame, got %d frames, first %+v", code, len(fs), fs[0])
	}
	return fs[0].Error
}

func waitHealth(t *testing.T, c *workerclient.Client, what string, ok func(*wire.HealthReply) bool) *wire.HealthReply {
	t.Helper()
	var h *wire.HealthReply
	proctest.WaitFor(t, 30*time.Second, what, func() (bool, string) {
		var err error
		h, err = c.Health(t.Context())
		return err == nil && ok(h), fmt.Sprint(h, err)
	})
	return h
}

// TestDetachSurvivesConnectionLoss: the connection of a detachable
// request's stream dies as a killed process's does (no CONNECTION_CLOSE;
// under -short, closed).
// The worker keeps generating, buffering frames, and an Attach at a higher
// epoch from another connection gets every frame of the request, equal
// to a fault-free run's, stamped with its epoch. Once finished, another
// Attach from k+1 gets exactly k+1..N and the finish frame.
func TestDetachSurvivesConnectionLoss(t *testing.T) {
	t.Parallel()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// Outlasts the idle timeout after the kill (quic-go's least, 5 s):
	// 1,600 paced tokens take 8 s at least.
	n := int32(1600)
	if testing.Short() {
		n = 300
	}
	// The fault-free run and the doomed one side by side (one batch:
	// the bits do not depend on it); the reference is read once the
	// doomed connection is dead.
	ref, err := c.Generate(ctx, seeded("ref", 1, 0, n))
	if err != nil {
		t.Fatal(err)
	}
	doomed, kill := w.dialDoomed(t)
	s, err := doomed.Generate(ctx, seeded("r", 1, 30*time.Second, n))
	if err != nil {
		t.Fatal(err)
	}
	const k = 20
	first := readN(t, s, k)
	kill()
	want := clustertest.CollectFrames(t, ref)
	if len(want) != int(n)+1 || want[n].FinishReason != "length" {
		t.Fatalf("reference: %d frames, last %+v", len(want), want[len(want)-1])
	}
	sameFrames(t, first, want[:k], 1, 1)
	h := waitHealth(t, c, "frames generated while detached", func(h *wire.HealthReply) bool { return h.FramesBuffered > 0 })
	if h.Detached != 1 || h.InFlight != 1 {
		t.Fatalf("health while detached: %+v", h)
	}
	taker := w.dial(t)
	got := clustertest.CollectFrames(t, attachOK(t, ctx, taker, "r", 2, 1))
	sameFrames(t, got, want, 1, 2)
	contiguous(t, got[:n], 1, 2)

	tail := clustertest.CollectFrames(t, attachOK(t, ctx, taker, "r", 3, k+1))
	sameFrames(t, tail, want, k+1, 3)
	if h, err := c.Health(ctx); err != nil || h.Attaches != 2 || h.Detached != 0 || h.InFlight != 0 || h.FramesDropped != 0 {
		t.Fatalf("health after the takeovers: %+v %v", h, err)
	}
}

// TestNotDetachableConnectionLossCancels: without a grace, a stream's
// connection dying (as a killed process's does; under -short, closed)
// cancels its request, as it always did, and there is nothing to attach
// to.
func TestNotDetachableConnectionLossCancels(t *testing.T) {
	t.Parallel()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	doomed, kill := w.dialDoomed(t)
	s, err := doomed.Generate(ctx, seeded("r", 1, 0, 3000))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, s, 1)
	kill()
	h := waitHealth(t, c, "the request cancelled", func(h *wire.HealthReply) bool { return h.InFlight == 0 && h.Running == 0 })
	if h.FramesBuffered != 0 || h.Detached != 0 {
		t.Fatalf("health: %+v", h)
	}
	refused(t, attach(t, ctx, c, "r", 2, 1), wire.Code_NOT_FOUND)
}

// TestDetachExplicitCancel: Stream.Cancel of a detachable request, or the
// end of its call's ctx, cancels it at once; an Attach finds nothing.
func TestDetachExplicitCancel(t *testing.T) {
	t.Parallel()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	idle, err := c.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Generate(ctx, seeded("r", 1, 30*time.Second, 3000))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, s, 5)
	s.Cancel()
	h := waitHealth(t, c, "the request cancelled", func(h *wire.HealthReply) bool {
		return h.InFlight == 0 && h.Running == 0 && h.FreeBlocks == idle.FreeBlocks
	})
	if h.Detached != 0 || h.TokensGenerated > 1000 {
		t.Fatalf("health after the cancel: %+v", h)
	}
	refused(t, attach(t, ctx, c, "r", 2, 1), wire.Code_NOT_FOUND)

	sctx, scancel := context.WithCancel(ctx)
	s, err = c.Generate(sctx, seeded("r2", 1, 30*time.Second, 3000))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, s, 5)
	scancel()
	h = waitHealth(t, c, "the request cancelled by its ctx", func(h *wire.HealthReply) bool { return h.InFlight == 0 && h.Running == 0 })
	if h.Detached != 0 || h.TokensGenerated > 2000 {
		t.Fatalf("health after the ctx ended: %+v", h)
	}
	refused(t, attach(t, ctx, c, "r2", 2, 1), wire.Code_NOT_FOUND)
}

// TestDetachThenContextEnd: Stream.Detach called before the call's ctx
// ends wins over the cancel that ctx's end (or a later Cancel) sends:
// quic-go sends a stream's first STOP_SENDING only. The request stays
// detached and is attachable.
func TestDetachThenContextEnd(t *testing.T) {
	t.Parallel()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sctx, scancel := context.WithCancel(ctx)
	s, err := c.Generate(sctx, seeded("r", 1, 30*time.Second, 3000))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, s, 3)
	s.Detach()
	scancel()
	s.Cancel() // CodeCancel, after CodeDetach: not sent
	waitHealth(t, c, "the request detached", func(h *wire.HealthReply) bool { return h.Detached == 1 })
	proctest.Never(t, time.Second, "the detached request cancelled", func() (bool, string) {
		h, err := c.Health(ctx)
		return err != nil || h.InFlight != 1, fmt.Sprint(h, err)
	})
	s2 := attachOK(t, ctx, c, "r", 2, 1)
	contiguous(t, readN(t, s2, 50), 1, 2)
	s2.Cancel()
	waitHealth(t, c, "the request cancelled", func(h *wire.HealthReply) bool { return h.InFlight == 0 })
}

// TestAttachRace: two Attaches race at epochs e+1 and e+2; the e+2 one is
// served, the e+1 one ends taken over or stale, the first stream taken
// over. An Attach at an epoch not above the current is stale; a later
// one takes the stream over (TAKEN_OVER naming the new epoch).
func TestAttachRace(t *testing.T) {
	t.Parallel()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const e = 5
	first, err := c.Generate(ctx, seeded("r", e, 30*time.Second, 4000))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, first, 1)
	var streams [2]*workerclient.Stream
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() {
			s, err := c.Attach(ctx, &wire.Attach{RequestId: "r", RequestEpoch: e + 1 + uint64(i), FromSequenceNo: 1})
			if err != nil {
				t.Error(err)
			}
			streams[i] = s
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	fs := clustertest.CollectFrames(t, first)
	if last := fs[len(fs)-1]; last.Error.GetCode() != wire.Code_TAKEN_OVER {
		t.Fatalf("first stream ended %+v", last)
	}
	contiguous(t, fs[:len(fs)-1], 2, e)
	// e+1 came first and was taken over (accepted), or second and stale.
	accepted := uint64(2)
	fs = clustertest.CollectFrames(t, streams[0])
	if len(fs) > 1 { // accepted, then taken over: its acceptance first
		if fs[0].SequenceNo != 0 || fs[0].Error != nil || fs[0].FinishReason != "" {
			t.Fatalf("epoch %d stream: first frame %+v, want its acceptance", e+1, fs[0])
		}
		fs = fs[1:]
	}
	switch last := fs[len(fs)-1]; last.Error.GetCode() {
	case wire.Code_TAKEN_OVER:
		accepted++
	case wire.Code_STALE_EPOCH:
		if len(fs) != 1 {
			t.Fatalf("epoch %d stream: %d frames before it was refused", e+1, len(fs)-1)
		}
	default:
		t.Fatalf("epoch %d stream ended %+v", e+1, last)
	}
	acceptance(t, streams[1], e+2)
	contiguous(t, readN(t, streams[1], 30), 1, e+2)

	for _, epoch := range []uint64{e + 2, e + 1, e} {
		refused(t, attach(t, ctx, c, "r", epoch, 1), wire.Code_STALE_EPOCH)
	}
	last := attachOK(t, ctx, c, "r", e+3, 1)
	contiguous(t, readN(t, last, 60), 1, e+3)
	fs = clustertest.CollectFrames(t, streams[1])
	end := fs[len(fs)-1]
	if end.Error.GetCode() != wire.Code_TAKEN_OVER || !strings.Contains(end.Error.GetMessage(), fmt.Sprint(e+3)) || end.RequestEpoch != e+2 {
		t.Fatalf("epoch %d stream ended %+v", e+2, end)
	}
	contiguous(t, fs[:len(fs)-1], 31, e+2)
	last.Cancel()
	h := waitHealth(t, c, "the request cancelled", func(h *wire.HealthReply) bool { return h.InFlight == 0 && h.Running == 0 })
	if h.Attaches != accepted {
		t.Fatalf("attaches: want %d: %+v", accepted, h)
	}
	refused(t, attach(t, ctx, c, "r", e+4, 1), wire.Code_NOT_FOUND)
}

// TestDetachGraceExpires: a request detached (Stream.Detach) that nobody
// attaches within its grace is cancelled and its blocks freed; an Attach
// then finds nothing.
func TestDetachGraceExpires(t *testing.T) {
	t.Parallel()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	idle, err := c.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Generate(ctx, seeded("r", 1, 300*time.Millisecond, 4000))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, s, 3)
	s.Detach()
	h := waitHealth(t, c, "the request cancelled after its grace", func(h *wire.HealthReply) bool {
		return h.InFlight == 0 && h.Running == 0 && h.FreeBlocks == idle.FreeBlocks
	})
	if h.Detached != 0 || h.FramesBuffered == 0 || h.TokensGenerated > 3000 {
		t.Fatalf("health after the grace: %+v", h)
	}
	refused(t, attach(t, ctx, c, "r", 2, 1), wire.Code_NOT_FOUND)
}

// TestDetachFinishedKeptForGrace: a finished detachable request's frames
// stay attachable for its grace (the tail and the finish frame), then it
// is forgotten.
func TestDetachFinishedKeptForGrace(t *testing.T) {
	t.Parallel()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := c.Generate(ctx, seeded("r", 1, 2*time.Second, 12))
	if err != nil {
		t.Fatal(err)
	}
	want := clustertest.CollectFrames(t, s)
	ended := time.Now()
	if len(want) != 13 || want[12].FinishReason != "length" {
		t.Fatalf("%d frames, last %+v", len(want), want[len(want)-1])
	}
	sameFrames(t, clustertest.CollectFrames(t, attachOK(t, ctx, c, "r", 2, 9)), want, 9, 2)
	epoch := uint64(3)
	proctest.WaitFor(t, 30*time.Second, "the finished request forgotten", func() (bool, string) {
		fs := clustertest.CollectFrames(t, attach(t, ctx, c, "r", epoch, 12))
		epoch++
		return fs[0].Error.GetCode() == wire.Code_NOT_FOUND, fmt.Sprint(fs[0])
	})
	if d := time.Since(ended); d < 2*time.Second {
		t.Fatalf("forgotten %v after it ended, before its grace", d)
	}
}

// TestAttachBadInput: malformed Attaches and graces get typed errors.
func TestAttachBadInput(t *testing.T) {
	t.Parallel()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	refused(t, attach(t, ctx, c, "", 1, 1), wire.Code_INVALID_REQUEST)
	refused(t, attach(t, ctx, c, "r", 1, -1), wire.Code_INVALID_REQUEST)
	refused(t, attach(t, ctx, c, "nobody", 1, 1), wire.Code_NOT_FOUND)
	s, err := c.Generate(ctx, seeded("r", 1, workerclient.MaxDetachGrace+time.Second, 4))
	if err != nil {
		t.Fatal(err)
	}
	refused(t, s, wire.Code_INVALID_REQUEST)
	// A Generate of a request held here at a higher epoch is stale.
	s, err = c.Generate(ctx, seeded("r", 4, time.Minute, 4))
	if err != nil {
		t.Fatal(err)
	}
	clustertest.CollectFrames(t, s)
	s, err = c.Generate(ctx, seeded("r", 3, time.Minute, 4))
	if err != nil {
		t.Fatal(err)
	}
	refused(t, s, wire.Code_STALE_EPOCH)
}

// TestDetachNoGoroutineLeak: a worker stopped with a detached request
// running (which nobody can attach to any more: it is cancelled, not
// waited for its grace), a finished one kept, and clients gone leaves no
// goroutine behind.
// Not in parallel: it counts the process's goroutines.
func TestDetachNoGoroutineLeak(t *testing.T) {
	base := runtime.NumGoroutine()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	s, err := c.Generate(ctx, seeded("detached", 1, time.Minute, 4000))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, s, 2)
	s.Detach()
	s, err = c.Generate(ctx, seeded("finished", 1, time.Minute, 4))
	if err != nil {
		t.Fatal(err)
	}
	clustertest.CollectFrames(t, s)
	waitHealth(t, c, "one request detached", func(h *wire.HealthReply) bool { return h.Detached == 1 })
	cancel()
	c.Close()
	began := time.Now()
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d > 20*time.Second {
		t.Fatalf("the worker took %v to stop", d)
	}
	last, ok := proctest.Poll(10*time.Second, func() (bool, string) {
		n := runtime.NumGoroutine()
		return n <= base, fmt.Sprintf("%d goroutines, want at most %d", n, base)
	})
	if !ok {
		buf := make([]byte, 1<<20)
		t.Fatalf("%s:\n%s", last, buf[:runtime.Stack(buf, true)])
	}
}

// TestDetachDrain: a drain's deadline ends detachable requests in flight
// as it ends any (a retryable DRAINING error frame after the tokens),
// attached or detached: a detached one's error frame is kept for an
// Attach.
func TestDetachDrain(t *testing.T) {
	t.Parallel()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	attached, err := c.Generate(ctx, seeded("attached", 1, 30*time.Second, 4000))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, attached, 1)
	detached, err := c.Generate(ctx, seeded("detached", 1, 30*time.Second, 4000))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, detached, 1)
	detached.Detach()
	waitHealth(t, c, "one request detached", func(h *wire.HealthReply) bool { return h.Detached == 1 && h.InFlight == 2 })
	if _, err := c.AdminWith(ctx, &wire.Admin{InstanceId: "w", CurrentGeneration: 1, Draining: true, EndInFlight: true}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		s     *workerclient.Stream
		from  int
		epoch uint64
	}{{attached, 2, 1}, {attachOK(t, ctx, c, "detached", 2, 1), 1, 2}} {
		fs := clustertest.CollectFrames(t, r.s)
		last := fs[len(fs)-1]
		if last.FinishReason != "error" || last.Error.GetCode() != wire.Code_DRAINING || !last.Error.GetRetryable() {
			t.Fatalf("ended %+v", last)
		}
		contiguous(t, fs[:len(fs)-1], r.from, r.epoch)
	}
	waitHealth(t, c, "nothing in flight", func(h *wire.HealthReply) bool { return h.InFlight == 0 && h.Detached == 0 })
}

// TestAttachAfterFramesDropped: a request's log keeps its newest frames
// only; an Attach from before them gets NOT_FOUND saying so, one from
// within them gets the tail, and the health counts what was dropped.
func TestAttachAfterFramesDropped(t *testing.T) {
	defer func(n int) { frameLogLimit = n }(frameLogLimit)
	frameLogLimit = 50
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := c.Generate(ctx, seeded("r", 1, time.Minute, 200))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, s, 1)
	s.Detach()
	h := waitHealth(t, c, "the detached request finished", func(h *wire.HealthReply) bool { return h.InFlight == 0 })
	if h.FramesDropped != 201-50 || h.FramesBuffered < 150 {
		t.Fatalf("health: %+v", h)
	}
	if e := refused(t, attach(t, ctx, c, "r", 2, 1), wire.Code_NOT_FOUND); !strings.Contains(e.Message, "frames dropped through sequence 151") {
		t.Fatalf("refusal: %v", e)
	}
	refused(t, attach(t, ctx, c, "r", 2, 151), wire.Code_NOT_FOUND)
	fs := clustertest.CollectFrames(t, attachOK(t, ctx, c, "r", 2, 152))
	if len(fs) != 50 || fs[49].FinishReason != "length" {
		t.Fatalf("%d frames, last %+v", len(fs), fs[len(fs)-1])
	}
	contiguous(t, fs[:49], 152, 2)
}

// TestAttachToAContinuation: a migration's continuation (a Generate with
// a prefix of k tokens) holds frames from k+1 only: an Attach from 1 is
// refused NOT_FOUND (the new owner, which lacks tokens 1..k, regenerates),
// one from k+1 gets them, identical to the first stream's.
func TestAttachToAContinuation(t *testing.T) {
	t.Parallel()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ref, err := c.Generate(ctx, seeded("ref", 1, 0, 20))
	if err != nil {
		t.Fatal(err)
	}
	all := clustertest.CollectFrames(t, ref)
	const k = 8
	g := seeded("r", 1, 30*time.Second, 20)
	for _, f := range all[:k] {
		g.PrefixTokens = append(g.PrefixTokens, f.TokenId)
	}
	s, err := c.Generate(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	want := clustertest.CollectFrames(t, s)
	if len(want) == 0 || want[0].SequenceNo != k+1 {
		t.Fatalf("continuation's first frame %+v, want sequence %d", want, k+1)
	}
	if e := refused(t, attach(t, ctx, c, "r", 2, 1), wire.Code_NOT_FOUND); !strings.Contains(e.Message, "from sequence 9") {
		t.Fatalf("refusal %q does not say where the continuation starts", e.Message)
	}
	sameFrames(t, clustertest.CollectFrames(t, attachOK(t, ctx, c, "r", 3, k+1)), want, k+1, 3)
}
