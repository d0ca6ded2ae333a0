// Package worker serves a reference-engine instance over QUIC with mutual
// TLS: one bidirectional stream per request, protobuf frames (decode/wire)
// stamped with the instance id and generation. Its client, and the
// protocol's constants, are in decode/workerclient.
package worker

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/failpoint"
	"github.com/lifeline-llm/lifeline/internal/frame"
	"github.com/lifeline-llm/lifeline/rdma/transferclient"
)

// Failpoints of the worker.
const (
	// FailBeforeReady is hit once the worker serves, before it announces
	// so: a worker its agent has not recorded yet.
	FailBeforeReady = "worker.before-ready"
	// FailAfterReady is hit once the worker has announced it serves.
	FailAfterReady = "worker.after-ready"
	// FailStaleFrame, armed with "error", makes the worker send a frame of
	// the request's previous epoch before the real ones.
	FailStaleFrame = "worker.stale-frame"
	// FailBeforeHandOff is hit by a prefill-only request after its blocks
	// are published, before the hand-off frame is sent.
	FailBeforeHandOff = "worker.before-handoff"
	// FailBeforeFinish is hit by a request that generated tokens here
	// (canaries excluded) after its last token's frame, before its finish
	// frame: a
	// worker dying exactly there leaves a frontend with every token and no
	// end.
	FailBeforeFinish = "worker.before-finish"
)

// Options configure one worker process (rank 0 of an instance).
type Options struct {
	InstanceID string
	Generation uint64
	Role       string
	Listen     string
	CertDir    string
	// KVTransfer is the node agent's KV transfer endpoint: a migrated
	// request's blocks are pulled into the node through it.
	KVTransfer string
	Engine     decode.Options
	// MemoryHeadroom bounds the Go runtime's memory at what it holds once
	// loaded plus this many bytes, or a quarter of the live heap when more
	// (a soft limit: the collector works harder near it); 0:
	// DefaultMemoryHeadroom, below 0: no bound.
	MemoryHeadroom int64
	// Log receives what the worker has to say that no client is told
	// (refused peers, failed pulls, drain decisions); nil: nothing.
	Log *slog.Logger
}

// Validate names the first bad field.
func (o *Options) Validate() error {
	switch {
	case o.InstanceID == "":
		return errors.New("worker: instance-id: empty")
	case o.Generation == 0:
		return errors.New("worker: generation: must be positive")
	case o.Role != "decode" && o.Role != "prefill" && o.Role != "both":
		return fmt.Errorf("worker: role: %q (want decode, prefill or both)", o.Role)
	case o.Listen == "":
		return errors.New("worker: listen: empty")
	case !oneAddress(o.Listen):
		return fmt.Errorf("worker: listen: %q (want IP:port of one interface, not a name or the wildcard: the Ready line tells clients where to dial)", o.Listen)
	case o.CertDir == "":
		return errors.New("worker: certs: empty (components only talk mutual TLS)")
	}
	return o.Engine.Validate()
}

// oneAddress reports whether hostport names one IP address.
func oneAddress(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	ip := net.ParseIP(host)
	return err == nil && ip != nil && !ip.IsUnspecified()
}

// Run loads the engine, serves until ctx is done, and prints a Ready line
// to out once the endpoint accepts connections.
func Run(ctx context.Context, opts Options, out io.Writer) error {
	if opts.Engine.TP > 1 && opts.Engine.Rank > 0 {
		return runFollower(ctx, opts, out)
	}
	// The worker writes the shared arena as its instance and generation.
	if opts.Engine.KVSocket != "" && opts.Engine.InstanceID == "" {
		opts.Engine.InstanceID, opts.Engine.Generation = opts.InstanceID, opts.Generation
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	opts.Log = cmp.Or(opts.Log, slog.New(slog.DiscardHandler))
	tlsConf, err := serverTLS(opts)
	if err != nil {
		return err
	}
	e, err := decode.NewEngine(opts.Engine)
	if err != nil {
		// The agent shows why, rather than only counting exits.
		json.NewEncoder(out).Encode(workerclient.Ready{InstanceID: opts.InstanceID, Generation: opts.Generation, Error: err.Error()})
		return err
	}
	defer e.Close()
	boundHeap(headroom(opts.MemoryHeadroom))
	ln, err := quic.ListenAddr(opts.Listen, tlsConf, workerclient.QUICConfig())
	if err != nil {
		return fmt.Errorf("worker: listen %s: %w", opts.Listen, err)
	}
	defer ln.Close()
	s := &server{opts: opts, engine: e}
	if opts.KVTransfer != "" {
		kvTLS, err := transferclient.TLS(opts.CertDir)
		if err != nil {
			return err
		}
		s.kv = transferclient.NewDialer(kvTLS)
		defer s.kv.Close()
	}
	s.generation.Store(opts.Generation)
	s.accepting.Store(true)
	if err := announce(out, readyLine(opts, ln, e)); err != nil {
		return err
	}
	ctx, cancel := s.stopOnEngineFailure(ctx, ln)
	defer cancel(nil)
	// Once every connection is done, nobody can attach to a detachable
	// request any more: the engine ends after every sequence did.
	defer func() {
		s.stopDetached()
		s.bg.Wait()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept(ctx)
		if err != nil {
			if err := engineFailed(ctx); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("worker: accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, conn)
		}()
	}
}

type server struct {
	opts   Options
	engine *decode.Engine
	// generation is stamped on every frame; the agent raises it when it
	// re-registers the instance. accepting is cleared while the agent
	// cannot prove it is routable.
	generation atomic.Uint64
	accepting  atomic.Bool
	kv         *transferclient.Dialer
	// draining: the agent is draining the node; refusals say DRAINING.
	draining atomic.Bool
	// started counts generation requests taken (canaries excluded);
	// inFlight holds each one being served, so that a drain can decide
	// for it and its deadline can end it. The drain counters are guarded
	// by mu too.
	started                     atomic.Uint64
	mu                          sync.Mutex
	inFlight                    map[*flight]struct{}
	drainMoved, drainFinishedIn uint64

	// Detachable requests (detach.go) by request id, guarded by smu
	// (taken after a session's lock, never before), and their counters.
	// bg holds their engine pumps; stopping is set once the worker stops.
	smu                                     sync.Mutex
	sessions                                map[string]*session
	framesBuffered, framesDropped, attaches atomic.Uint64
	detachedNow                             atomic.Int64
	stopping                                atomic.Bool
	bg                                      sync.WaitGroup
	// schemas are compiled structured-output schemas (structured.go).
	schemas schemaCache
}

// closeGrace is how long a connection stays open, once the worker stops,
// after the last frame written on it: enough for that frame to be
// delivered (and retransmitted if lost) before CONNECTION_CLOSE, which
// discards whatever the connection has not sent yet.
const closeGrace = 1500 * time.Millisecond

// serveConn serves conn's streams until the worker stops (ctx) or the peer
// goes. On a stop it accepts no more streams, lets those in flight finish
// writing, and closes the connection once the peer closed it or closeGrace
// passed since its last write.
func (s *server) serveConn(ctx context.Context, conn *quic.Conn) {
	var lastWrite atomic.Int64 // unix nanoseconds
	var wg sync.WaitGroup
	for {
		st, err := conn.AcceptStream(ctx)
		if err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveStream(st)
			lastWrite.Store(time.Now().UnixNano())
		}()
	}
	wg.Wait()
	// An aborted group's rank 0 leaves at once: its frames are errors,
	// and its agent restarts the whole group.
	if last := lastWrite.Load(); last != 0 && !groupAborted(ctx) {
		t := time.NewTimer(time.Until(time.Unix(0, last).Add(closeGrace)))
		select {
		case <-conn.Context().Done():
		case <-t.C:
		}
		t.Stop()
	}
	conn.CloseWithError(0, "")
}

func (s *server) stamp(f *wire.Frame) *wire.Frame {
	f.InstanceId, f.Generation = s.opts.InstanceID, s.generation.Load()
	return f
}

func (s *server) serveStream(st *quic.Stream) {
	defer st.Close()
	var req wire.Request
	if err := frame.Read(bufio.NewReader(st), &req); err != nil {
		st.CancelRead(1)
		return
	}
	w := bufio.NewWriter(st)
	send := func(f *wire.Frame) error {
		if err := frame.Write(w, s.stamp(f)); err != nil {
			return err
		}
		return w.Flush()
	}
	switch op := req.Op.(type) {
	case *wire.Request_Health:
		send(&wire.Frame{Health: s.health()})
	case *wire.Request_Admin:
		a := op.Admin
		if a.InstanceId != s.opts.InstanceID || a.CurrentGeneration > s.generation.Load() {
			send(&wire.Frame{FinishReason: "error", Error: &wire.Error{Code: wire.Code_INVALID_REQUEST,
				Message: fmt.Sprintf("admin for %s at generation %d reached %s at %d", a.InstanceId, a.CurrentGeneration, s.opts.InstanceID, s.generation.Load())}})
			return
		}
		// A generation only ever goes up.
		for {
			cur := s.generation.Load()
			if a.Generation <= cur || s.generation.CompareAndSwap(cur, a.Generation) {
				break
			}
		}
		s.accepting.Store(a.Accepting)
		s.draining.Store(a.Draining)
		if a.DrainDeadlineUnixMs > 0 {
			s.decideDrain(time.UnixMilli(a.DrainDeadlineUnixMs))
		}
		if a.EndInFlight {
			s.endInFlight()
		}
		send(&wire.Frame{Health: s.health()})
	case *wire.Request_Generate:
		s.generate(st, op.Generate, send)
	case *wire.Request_Attach:
		s.attach(st, op.Attach, send)
	default:
		send(&wire.Frame{FinishReason: "error", Error: &wire.Error{Code: wire.Code_INVALID_REQUEST, Message: "unknown operation"}})
	}
}

func (s *server) health() *wire.HealthReply {
	st := s.engine.Stats()
	h := &wire.HealthReply{Ready: true, Running: uint32(st.Running), Queued: uint32(st.Queued),
		FreeBlocks: uint32(st.FreeBlocks), NumericsId: s.engine.NumericsID(), Model: s.engine.ModelName(),
		ModelRevision: s.engine.ModelRevision(), Accepting: s.accepting.Load(), TokensGenerated: st.Generated,
		PositionsComputed: st.Computed, StepTimeUs: uint64(st.StepTime.Microseconds()), MeanStepTimeUs: uint64(st.MeanStepTime.Microseconds()), RequestsStarted: s.started.Load(),
		DraftProposed: st.DraftProposed, DraftAccepted: st.DraftAccepted}
	s.mu.Lock()
	h.InFlight, h.DrainMovedEarly, h.DrainFinishedInPlace = uint32(len(s.inFlight)), s.drainMoved, s.drainFinishedIn
	s.mu.Unlock()
	h.FramesBuffered, h.FramesDropped, h.Attaches = s.framesBuffered.Load(), s.framesDropped.Load(), s.attaches.Load()
	h.Detached = uint32(max(s.detachedNow.Load(), 0))
	h.LiveHeapBytes, h.HeapGoalBytes, h.MemoryLimitBytes = heapStats()
	return h
}

// heapStats reads the Go heap's live bytes (as of the last GC), its goal
// and the soft memory limit (0 when there is none).
func heapStats() (live, goal, limit uint64) {
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/goal:bytes"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(samples)
	v := func(i int) uint64 {
		if samples[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return samples[i].Value.Uint64()
	}
	live, goal, limit = v(0), v(1), v(2)
	if limit == math.MaxInt64 {
		limit = 0
	}
	return live, goal, limit
}

// headroom is o's memory headroom with its default.
func headroom(h int64) int64 {
	if h == 0 {
		return DefaultMemoryHeadroom
	}
	return h
}

func intsOf(v []int32) []int {
	if v == nil {
		return nil
	}
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

// refusal is the error of a request a worker that does not accept refuses.
func (s *server) refusal() *wire.Error {
	if s.draining.Load() {
		return &wire.Error{Code: wire.Code_DRAINING, Retryable: true, Message: "not accepting new requests: the node is draining"}
	}
	return &wire.Error{Code: wire.Code_FENCED, Retryable: true, Message: "not accepting new requests: the node agent cannot prove its registration lease"}
}

func (s *server) generate(st *quic.Stream, g *wire.Generate, send func(*wire.Frame) error) {
	if !s.accepting.Load() && g.Lane != wire.Lane_CANARY {
		send(&wire.Frame{RequestId: g.RequestId, RequestEpoch: g.RequestEpoch, FinishReason: "error", Error: s.refusal()})
		return
	}
	if g.DetachGraceMs > 0 {
		s.generateDetachable(st, g, send)
		return
	}
	// The stream's context ends when the client resets or goes away: that
	// cancels the sequence and frees its blocks. A drain ends it too
	// (errDrainMove, errDrainDeadline).
	ctx, cancel := context.WithCancelCause(st.Context())
	defer cancel(nil)
	fl := s.startFlight(g, cancel)
	if g.Lane != wire.Lane_CANARY {
		defer s.untrack(fl)
	}
	events, err := s.start(ctx, g)
	if err != nil {
		send(&wire.Frame{RequestId: g.RequestId, RequestEpoch: g.RequestEpoch, FinishReason: "error", Error: ErrorFrame(err)})
		return
	}
	s.staleFrame(g, send)
	first, ok := s.awaitStart(g, events, send)
	if !ok {
		return
	}
	if send(s.frameOf(ctx, g, fl, first)) != nil || first.Done {
		drainEvents(events)
		return
	}
	for ev := range events {
		if send(s.frameOf(ctx, g, fl, ev)) != nil {
			// The client is gone; the stream context cancels the request.
			drainEvents(events)
			return
		}
	}
}

// drainEvents reads a sequence's events to their end.
func drainEvents(events <-chan decode.Event) {
	for range events {
	}
}

// generateDetachable serves a Generate with a detach grace: the sequence
// runs on its own context (only an explicit cancel, the grace, a drain
// or the worker's stop end it), the engine's frames go to the session's
// log, and this stream is its first attachment.
func (s *server) generateDetachable(st *quic.Stream, g *wire.Generate, send func(*wire.Frame) error) {
	grace := time.Duration(g.DetachGraceMs) * time.Millisecond
	if grace > workerclient.MaxDetachGrace {
		send(errorFrame(g.RequestId, g.RequestEpoch, wire.Code_INVALID_REQUEST, "detach_grace_ms: %d (at most %d)",
			g.DetachGraceMs, workerclient.MaxDetachGrace.Milliseconds()))
		return
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	a := newAttachment(st, g.RequestEpoch, 0)
	ss := &session{id: g.RequestId, grace: grace, cancel: cancel, epoch: g.RequestEpoch, log: newFrameLog(frameLogLimit),
		att: a, changed: make(chan struct{}), firstSeq: int32(len(g.PrefixTokens)) + 1}
	if err := s.register(ss); err != nil {
		cancel(nil)
		send(errorFrame(g.RequestId, g.RequestEpoch, wire.Code_STALE_EPOCH, "generate: %v", err))
		return
	}
	fl := s.startFlight(g, cancel)
	s.staleFrame(g, send)
	s.bg.Add(1)
	go s.pump(ctx, ss, g, fl)
	s.serveAttached(ss, a, 0)
}

// pump runs a detachable request's sequence into its session's log.
func (s *server) pump(ctx context.Context, ss *session, g *wire.Generate, fl *flight) {
	defer s.bg.Done()
	defer ss.cancel(nil)
	if g.Lane != wire.Lane_CANARY {
		defer s.untrack(fl)
	}
	events, err := s.start(ctx, g)
	if err != nil {
		s.record(ss, &wire.Frame{RequestId: g.RequestId, RequestEpoch: g.RequestEpoch, FinishReason: "error", Error: ErrorFrame(err)}, true)
		return
	}
	first, ok := s.awaitStart(g, events, func(f *wire.Frame) error { s.record(ss, f, false); return nil })
	if !ok {
		return
	}
	s.record(ss, s.frameOf(ctx, g, fl, first), first.Done)
	for ev := range events {
		s.record(ss, s.frameOf(ctx, g, fl, ev), ev.Done)
	}
}

// startFlight describes a generation request for drains (canaries
// excepted, which are not tracked).
func (s *server) startFlight(g *wire.Generate, cancel context.CancelCauseFunc) *flight {
	fl := &flight{id: g.RequestId, cancel: cancel, maxTokens: int(g.MaxTokens)}
	fl.sent.Store(int64(len(g.PrefixTokens)))
	if g.Lane != wire.Lane_CANARY {
		s.track(fl)
	}
	return fl
}

// sequenceID is the engine's id of g's sequence on this instance.
func sequenceID(g *wire.Generate, instanceID string) string {
	return fmt.Sprintf("%s/%d/%s", g.RequestId, g.RequestEpoch, instanceID)
}

// request is g for the engine.
func request(g *wire.Generate, instanceID string) decode.Request {
	prio := sched.Interactive
	switch g.Lane {
	case wire.Lane_BATCH:
		prio = sched.Batch
	case wire.Lane_CANARY:
		prio = sched.Canary
	}
	req := decode.Request{
		ID: sequenceID(g, instanceID), Prompt: g.Prompt, PromptTokens: intsOf(g.PromptTokens),
		PrefixTokens: intsOf(g.PrefixTokens), MaxTokens: int(g.MaxTokens), Stop: slices.Clone(g.Stop), IgnoreEOS: g.IgnoreEos, Priority: prio,
		Sampling: sample.Params{Temperature: g.Temperature, TopP: g.TopP, TopK: int(g.TopK), FrequencyPenalty: g.FrequencyPenalty,
			PresencePenalty: g.PresencePenalty, Seed: g.Seed, LogitBias: logitBias(g.LogitBias)},
		PrefillOnly: g.PrefillOnly, Logprobs: g.Logprobs, TopLogprobs: int(g.TopLogprobs),
	}
	if g.PromptTokens != nil && len(g.PromptTokens) == 0 {
		req.PromptTokens = []int{}
	}
	for _, m := range g.Messages {
		req.Messages = append(req.Messages, decode.ChatMessage{Role: m.Role, Content: m.Content})
	}
	return req
}

// staleFrame sends, when FailStaleFrame is armed, a delayed frame of the
// request's previous epoch, as a zombie worker of an older attempt would.
func (s *server) staleFrame(g *wire.Generate, send func(*wire.Frame) error) {
	if failpoint.Hit(FailStaleFrame) != nil && g.RequestEpoch > 0 {
		send(&wire.Frame{RequestId: g.RequestId, RequestEpoch: g.RequestEpoch - 1, SequenceNo: 1, Text: "STALE-EPOCH-FRAME"})
	}
}

// frameOf renders an engine event as the request's frame; ctx is the
// request's (its cause says whether a drain ended it).
func (s *server) frameOf(ctx context.Context, g *wire.Generate, fl *flight, ev decode.Event) *wire.Frame {
	f := &wire.Frame{RequestId: g.RequestId, RequestEpoch: g.RequestEpoch}
	if !ev.Done {
		f.SequenceNo, f.TokenId, f.Text = int32(ev.SequenceNo), int32(ev.TokenID), ev.Text
		s.setLogprobs(f, g, ev)
		fl.sent.Store(int64(ev.SequenceNo))
		return f
	}
	if g.PrefillOnly {
		failpoint.Hit(FailBeforeHandOff)
	} else if fl.sent.Load() > int64(len(g.PrefixTokens)) && g.Lane != wire.Lane_CANARY {
		failpoint.Hit(FailBeforeFinish)
	}
	s.finish(f, ev, context.Cause(ctx))
	fl.completed = ev.Err == nil
	return f
}

// finish fills a request's last frame from its Done event; cause is the
// request context's: a request a drain ended says DRAINING (retryable).
func (s *server) finish(f *wire.Frame, ev decode.Event, cause error) {
	f.FinishReason = string(ev.FinishReason)
	f.ReusedPositions = uint32(ev.ReusedPositions)
	f.PromptTokens = uint32(ev.PromptLen)
	for _, k := range s.engine.BlockKeys(ev.PromptTokens) {
		f.KvKeys = append(f.KvKeys, k[:])
	}
	if ev.Err != nil {
		f.Error = ErrorFrame(ev.Err)
	}
	if ev.Err != nil && (errors.Is(cause, errDrainDeadline) || errors.Is(cause, errDrainMove)) {
		f.FinishReason = "error"
		f.Error = &wire.Error{Code: wire.Code_DRAINING, Retryable: true, Message: cause.Error()}
	}
}

// start starts g's engine sequence under ctx, once the KV of its prefix
// was pulled from the peers it names (what could not be is computed).
func (s *server) start(ctx context.Context, g *wire.Generate) (<-chan decode.Event, error) {
	req := request(g, s.opts.InstanceID)
	var err error
	if req.Structured, err = s.structured(g); err != nil {
		return nil, err
	}
	if len(g.KvSources) > 0 && s.kv != nil {
		s.pullPrefix(ctx, g, req)
	}
	return s.engine.Generate(ctx, req)
}

func logitBias(m map[int32]float64) map[int]float64 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[int]float64, len(m))
	for id, b := range m {
		out[int(id)] = b
	}
	return out
}
