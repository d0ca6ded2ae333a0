package frontend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/route"
	"github.com/lifeline-llm/lifeline/kv/blockid"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
)

// This file holds the run's calls out: to the router, and to workers and
// agents. Answers that take a while come back to the run loop as events.

// tokenize encodes the prompt with the built-in tokenizer once per
// request, for prefixKeys.
func (x *run) tokenize() {
	if x.promptTokens != nil {
		return
	}
	tok := tokenizer.NewBuiltin()
	ids, err := x.body.PromptTokens, error(nil)
	switch t := x.body.tokenized; {
	case len(ids) > 0:
	case t != nil && t.text == x.body.Prompt:
		ids = t.ids // encoded by the admission check
	default:
		ids, err = tok.Encode(x.body.Prompt)
	}
	x.promptTokens = []int{}
	if err == nil {
		x.promptTokens = append([]int{tok.BOS()}, ids...)
	}
	// The usage the client is told counts the same tokens.
	x.st.setPromptLen(len(x.promptTokens))
}

func (x *run) route(a reqfsm.Route) []reqfsm.Action {
	rt := x.s.router
	x.tokenize() // before the router's lock: a long prompt takes a while
	prefer := ""
	if prev, ok := rt.Instance(x.on); ok {
		prefer = prev.NumericsID
	}
	// The signal first: a registration after the pick below wakes a wait.
	x.wake = x.s.capacity.watch(x.body.Model)
	exclude := a.Exclusion()
	below := 0
	if x.overloaded && x.r.Received() == 0 {
		below = x.fullAt
	}
	in, cached, used, err := rt.PickCachedBelow(x.body.Model, "", prefer, exclude, time.Now(), x.prefixKeys, below, x.body.Priority, x.r.Received() == 0)
	if err != nil {
		// Only refusals before any token make a 429: a migration with
		// tokens out (the 200 is sent) waits for capacity instead of
		// ending the stream as overloaded.
		overloaded := x.overloaded || errors.Is(err, route.ErrInstancesFull)
		return x.r.NoRoute(a.Epoch, overloaded && x.r.Received() == 0, time.Now())
	}
	x.obs.routed(cached, used)
	x.served = append(x.served, servedBy{in.NumericsID, in.Continuation})
	// The decode instance's load counts this request from the pick on,
	// so that a burst of concurrent picks spreads.
	x.releaseHold()
	x.hold, x.holdID = rt.Opened(in.ID), in.ID
	waited := x.r.CapacityWaited
	defer func() {
		if d := x.r.CapacityWaited - waited; d > 0 {
			x.obs.capacityFound(d)
		}
	}()
	d := reqfsm.Endpoint{InstanceID: in.ID, Generation: in.Generation}
	if p, ok := x.pickPrefill(in, cached, exclude); ok {
		return x.r.RoutedPD(a.Epoch, d, p, time.Now())
	}
	if x.r.Received() == 0 && rt.HasPrefill(x.body.Model) {
		x.obs.handOff("no_prefill")
	}
	return x.r.Routed(a.Epoch, d, time.Now())
}

// pickPrefill splits prefill from decode on d while nothing is generated
// yet and a prefill instance with d's numerics is there — unless d's node
// already holds the whole prompt (cached blocks of it).
func (x *run) pickPrefill(d route.Instance, cached int, exclude route.Exclusion) (reqfsm.Endpoint, bool) {
	keys := x.prefixKeys(d)
	whole := len(keys) > 0 && cached >= len(keys)
	if x.r.Received() > 0 || x.r.PrefillFailures >= reqfsm.MaxPrefillAttempts || whole {
		return reqfsm.Endpoint{}, false
	}
	p, err := x.s.router.PickPrefill(x.body.Model, d.ModelRevision, d.NumericsID, exclude, time.Now(), x.prefixKeys)
	if err != nil {
		return reqfsm.Endpoint{}, false
	}
	return reqfsm.Endpoint{InstanceID: p.ID, Generation: p.Generation}, true
}

// prefixKeys are the block keys of prompt ‖ received tokens under in's KV
// identity, when this frontend tokenizes the way in does (the built-in
// tokenizer); nil otherwise, and routing for in is by load only. The
// router calls it under its lock.
func (x *run) prefixKeys(in route.Instance) []blockid.BlockKey {
	id := in.KVIdentity
	if id == nil || id.BlockSize <= 0 || id.TokenizerHash != tokenizer.NewBuiltin().Hash() {
		return nil
	}
	if keys, ok := x.keys[*id]; ok && x.keysAt == x.r.Received() {
		return keys
	}
	if x.keysAt != x.r.Received() {
		x.keys, x.keysAt = map[blockid.Identity][]blockid.BlockKey{}, x.r.Received()
	}
	if len(x.promptTokens) == 0 {
		return nil // route tokenizes before it takes the router's lock
	}
	tokens := append(slices.Clone(x.promptTokens), x.r.Output.IDs()...)
	keys := id.Chain(tokens, (len(tokens)-1)/id.BlockSize)
	x.keys[*id] = keys
	return keys
}

func (x *run) routePrefill(a reqfsm.RoutePrefill) []reqfsm.Action {
	rt := x.s.router
	d, _ := rt.Instance(x.r.Endpoint.InstanceID)
	p, err := rt.PickPrefill(x.body.Model, d.ModelRevision, d.NumericsID, a.Exclusion(), time.Now(), x.prefixKeys)
	if err != nil {
		x.obs.handOff("no_prefill")
	}
	return x.r.PrefillRouted(a.Epoch, reqfsm.Endpoint{InstanceID: p.ID, Generation: p.Generation}, err == nil, time.Now())
}

// endPrefill cancels the prefill call to at, if one is open.
func (x *run) endPrefill(at reqfsm.Endpoint) {
	if cancel, ok := x.prefills[at]; ok {
		cancel()
		delete(x.prefills, at)
	}
}

// nodeOf is the node of an instance this run used or the router knows
// ("" if neither): a dead instance leaves the router, not this run.
func (x *run) nodeOf(id string) string {
	if n, ok := x.nodes[id]; ok {
		return n
	}
	n := x.s.router.NodeOf(id)
	if n != "" {
		x.nodes[id] = n
	}
	return n
}

// epochCtx is the context of every worker call of epoch; CancelWorker
// for the epoch ends them all.
func (x *run) epochCtx(ctx context.Context, epoch uint64) context.Context {
	c, cancel := context.WithCancel(ctx)
	if prev, ok := x.streams[epoch]; ok {
		x.streams[epoch] = func() { prev(); cancel() }
	} else {
		x.streams[epoch] = cancel
	}
	return c
}

// generateRequest is the worker request of this run at epoch.
func (x *run) generateRequest(epoch uint64, prefix []int) *wire.Generate {
	p := make([]int32, len(prefix))
	for i, t := range prefix {
		p[i] = int32(t)
	}
	b := x.body
	g := &wire.Generate{RequestId: x.r.ID, RequestEpoch: epoch, Prompt: b.Prompt, PrefixTokens: p, MaxTokens: int32(x.r.MaxTokens),
		TopK: int32(b.TopK), Seed: b.Seed, Stop: b.Stop, IgnoreEos: b.IgnoreEOS, FrequencyPenalty: b.FrequencyPenalty, PresencePenalty: b.PresencePenalty,
		Temperature: 1, TopP: 1}
	for _, t := range b.PromptTokens {
		g.PromptTokens = append(g.PromptTokens, int32(t))
	}
	if b.Temperature != nil {
		g.Temperature = *b.Temperature
	}
	if len(b.LogitBias) > 0 {
		g.LogitBias = make(map[int32]float64, len(b.LogitBias))
		for id, v := range b.LogitBias {
			g.LogitBias[int32(id)] = v
		}
	}
	if b.TopP != nil {
		g.TopP = *b.TopP
	}
	g.Structured = b.Structured.wire()
	g.Logprobs, g.TopLogprobs = b.Logprobs, int32(b.TopLogprobs)
	g.Messages = wireMessages(b)
	if b.Priority == route.PriorityBatch {
		g.Lane = wire.Lane_BATCH
	}
	return g
}

// prefill sends the prompt to the prefill instance; its hand-off (or
// failure) comes back as an event.
func (x *run) prefill(ctx context.Context, a reqfsm.Prefill) []reqfsm.Action {
	s, rt := x.s, x.s.router
	failed := func(err error) []reqfsm.Action { return x.r.OnPrefillFailed(a.Epoch, a.At, err.Error()) }
	c, err := s.client(ctx, a.At)
	if err != nil {
		return failed(err)
	}
	g := x.generateRequest(a.Epoch, nil)
	g.PrefillOnly = true
	if len(x.prefillNodes) > 0 {
		// An earlier prefill instance died: what it published on its
		// node is pulled, not computed again.
		g.KvSources = rt.KVSources(x.prefillNodes, rt.NodeOf(a.At.InstanceID))
	}
	// A prefill has its own cancel (a failed one is abandoned while the
	// epoch goes on), under the epoch's.
	pctx, cancel := context.WithCancel(x.epochCtx(ctx, a.Epoch))
	x.prefills[a.At] = cancel
	st, err := c.c.Generate(pctx, g)
	if err != nil {
		s.pool.release(c)
		return failed(err)
	}
	p, _ := rt.Instance(a.At.InstanceID)
	kv := reqfsm.KVRef{From: a.At, Node: x.nodeOf(a.At.InstanceID), KVAddr: p.KVAddr}
	// Announcements of either instance's death reach this run: the
	// decode instance is chosen already, and may die while P works.
	s.track(x, a.At.InstanceID, x.r.Endpoint.InstanceID)
	s.goes.Go(func() { x.awaitHandOff(pctx, c, st, a.Epoch, kv) })
	return nil
}

// awaitHandOff reads a prefill stream to its hand-off (the keys of the
// blocks published, completing kv) or failure, and delivers it.
func (x *run) awaitHandOff(ctx context.Context, c *pooled, st *workerclient.Stream, epoch uint64, kv reqfsm.KVRef) {
	defer x.s.pool.release(c)
	res := &prefillResult{at: kv.From}
	for {
		f, err := st.Next()
		if err == nil {
			err = x.s.fenced(kv.From, c.addr, f)
		}
		switch {
		case err != nil && errors.Is(err, io.EOF):
			res.err = fmt.Errorf("prefill stream ended without a hand-off")
		case err != nil:
			res.err = err
		case f.Error != nil:
			res.err = fmt.Errorf("prefill: %s", f.Error.Message)
		case f.FinishReason == "prefilled":
			kv.Keys = f.KvKeys
			res.kv = kv
		case f.FinishReason != "":
			res.err = fmt.Errorf("prefill ended with %q", f.FinishReason)
		default:
			continue
		}
		if ctx.Err() == nil {
			x.deliver(ctx, event{epoch: epoch, prefill: res})
		}
		return
	}
}

// fenced checks a frame of a stream opened to ep, on a connection to
// addr, against the registry: a frame stamped with an older generation
// than the instance's newest registration comes from an endpoint that was
// replaced, and ends the stream. A worker re-registered after a lost lease
// stamps its new generation on the streams it keeps serving — but frames
// it stamped before it learnt it may still be on their way when the
// registration arrives: while the newest registration names the address
// the stream's connection goes to, its frames come from that same process
// (a connection does not outlive its process, and no other process can
// hold the port while it lives) and are not fenced.
func (s *Server) fenced(ep reqfsm.Endpoint, addr string, f *wire.Frame) error {
	g := s.router.Generation(ep.InstanceID)
	if f.Generation >= g {
		return nil
	}
	s.mu.Lock()
	same := addr != "" && s.addrs[ep.InstanceID] == addr
	s.mu.Unlock()
	if same {
		return nil
	}
	return fmt.Errorf("fenced: frame of %s at generation %d, registered at %d", ep.InstanceID, f.Generation, g)
}

// TransferTimeout bounds a P/D hand-off's pull.
const TransferTimeout = 5 * time.Second

// transfer asks the decode instance's node to pull the prompt's blocks
// from the prefill node; the answer comes back as an event.
func (x *run) transfer(ctx context.Context, a reqfsm.Transfer) {
	s := x.s
	d, _ := s.router.Instance(a.To.InstanceID)
	sources := s.router.KVSources([]string{a.KV.Node}, d.Node)
	b := &transferpb.Binding{RequestId: x.r.ID, ModelRevision: d.ModelRevision, SourceInstance: a.KV.From.InstanceID,
		SourceGeneration: a.KV.From.Generation, DestinationInstance: a.To.InstanceID, DestinationGeneration: a.To.Generation,
		FirstBlock: 0, BlockCount: uint32(len(a.KV.Keys)), RequestEpoch: a.Epoch, TransferEpoch: a.TransferEpoch}
	tctx := x.epochCtx(ctx, a.Epoch)
	s.goes.Go(func() {
		// Past TransferTimeout the decode instance computes the prompt
		// itself; the cancel also frees the pull's staged slots.
		pctx, cancel := context.WithTimeoutCause(tctx, TransferTimeout, fmt.Errorf("no answer within %v", TransferTimeout))
		defer cancel()
		res := &transferResult{transferEpoch: a.TransferEpoch}
		if d.KVAddr == "" {
			res.err = fmt.Errorf("decode node %s has no KV transfer endpoint", d.Node)
		} else {
			res.reply, res.err = s.kv.Pull(pctx, d.KVAddr, &transferpb.Pull{Binding: b, Keys: a.KV.Keys, Sources: sources})
			if res.err != nil && pctx.Err() != nil && tctx.Err() == nil {
				res.err = fmt.Errorf("kv transfer: %w", context.Cause(pctx))
			}
		}
		if tctx.Err() == nil {
			x.deliver(tctx, event{epoch: a.Epoch, transfer: res})
		}
	})
}

// takeHold is the count of this request's stream on instance id: the
// one its pick took, or a new one.
func (x *run) takeHold(id string) (closed func()) {
	if x.hold != nil && x.holdID == id {
		closed, x.hold = x.hold, nil
		return closed
	}
	x.releaseHold()
	return x.s.router.Opened(id)
}

// releaseHold uncounts a pick that was not dispatched.
func (x *run) releaseHold() {
	if x.hold != nil {
		x.hold()
		x.hold = nil
	}
}

func (x *run) dispatch(ctx context.Context, d reqfsm.Dispatch) []reqfsm.Action {
	s, rt := x.s, x.s.router
	x.r.Policy.Retries.Attempted(!x.dispatched)
	x.dispatched = true
	closed := x.takeHold(d.To.InstanceID)
	opened := false
	defer func() {
		if !opened {
			closed()
		}
	}()
	c, err := s.client(ctx, d.To)
	if err != nil {
		return x.r.OnWorkerFailed(d.Epoch, err.Error(), true, time.Now())
	}
	// The acknowledgement this frontend gives draining agents stays below
	// the view checked here until the worker has the request: an agent that
	// saw its draining registrations acknowledged gets nothing new.
	sent := s.ack.send()
	defer sent()
	// Pick only returns ready instances; one the view marked not ready or
	// draining since (a drain began) gets nothing: the request goes
	// elsewhere.
	if in, ok := rt.Instance(d.To.InstanceID); ok && (!in.Ready || in.Draining) {
		s.pool.release(c)
		x.obs.notReadyAvoided(d.To.InstanceID)
		return x.r.OnWorkerFailed(d.Epoch, fmt.Sprintf("instance %s became not ready before the send", d.To.InstanceID), true, time.Now())
	}
	g := x.generateRequest(d.Epoch, d.Prefix)
	if (len(d.Prefix) > 0 || len(x.prefillNodes) > 0) && !s.opts.NoKVPull {
		// A migration, or a prefill instance died: the blocks of prompt ‖
		// prefix may be published on the node of the instance that failed
		// (its agent outlives it) or of a prefill instance; the new worker
		// pulls what its node lacks.
		first := append([]string{x.nodeOf(x.on), x.nodeOf(x.lastPrefill)}, x.prefillNodes...)
		g.KvSources = rt.KVSources(first, rt.NodeOf(d.To.InstanceID))
	}
	g.DetachGraceMs = x.detachGrace()
	sctx := x.epochCtx(ctx, d.Epoch)
	st, err := c.c.Generate(sctx, g)
	if err != nil && sctx.Err() != nil {
		// Cancelled meanwhile (the client, this frontend stopping): not
		// the worker's failure, nor its connection's.
		s.pool.release(c)
		return nil
	}
	if err != nil {
		s.pool.release(c)
		s.dropClient(d.To)
		return x.r.OnWorkerFailed(d.Epoch, err.Error(), true, time.Now())
	}
	x.taken[d.Epoch] = true
	opened = true
	if len(d.Prefix) > 0 && x.st.rec != nil {
		// A continuation: its record learns the prefix, so a frontend
		// taking over attaches to it (attach.go).
		tokens := recordTokens(&x.r.Output, len(d.Prefix))
		s.goes.Go(func() { s.recs.migrated(context.WithoutCancel(s.ctx), x.st, tokens) })
	}
	x.on = d.To.InstanceID
	x.nodeOf(x.on)
	s.track(x, x.on)
	if g.DetachGraceMs > 0 {
		s.detachable(st, x.st, true)
	}
	s.goes.Go(func() {
		defer closed()
		x.readFrames(sctx, c, st, d.Epoch, d.To, nil)
	})
	return nil
}

// maxFrameBatch bounds the frames handed to the run loop as one event.
const maxFrameBatch = 64

// readFrames delivers a decode stream's frames (first, if not nil, was
// read already) until its finish, or its failure. It waits for one frame
// at a time, and hands every frame already received with it to the run
// loop as one event: a relay that falls behind its workers (thousands of
// streams) pays one hand-off and one wake of the client's writer per
// batch instead of per token, and one that keeps up adds no wait.
func (x *run) readFrames(ctx context.Context, c *pooled, st *workerclient.Stream, epoch uint64, to reqfsm.Endpoint, first *wire.Frame) {
	defer x.s.pool.release(c)
	defer x.s.detachable(st, nil, false)
	next := func() (*wire.Frame, error) {
		f, err := first, error(nil)
		if first == nil {
			f, err = st.Next()
		}
		first = nil
		if err == nil {
			err = x.s.fenced(to, c.addr, f)
		}
		return f, err
	}
	for {
		f, err := next()
		if err == nil {
			// The frames already received with f (a failure among them
			// is reported after them).
			e := event{epoch: epoch, frame: f, from: to}
			for last := f; last.FinishReason == "" && len(e.more) < maxFrameBatch-1 && st.Buffered(); {
				if last, err = next(); err != nil {
					break
				}
				e.more = append(e.more, last)
			}
			x.deliver(ctx, e)
			x.s.metrics.frameBatches.Inc()
			if err == nil && e.last().FinishReason != "" {
				return
			}
		}
		if err != nil {
			if ctx.Err() == nil {
				if errors.Is(err, io.EOF) {
					err = fmt.Errorf("worker stream ended without a finish")
				}
				x.deliver(ctx, event{epoch: epoch, err: err})
			}
			return
		}
	}
}

// last is the last frame of e's batch.
func (e event) last() *wire.Frame {
	if len(e.more) > 0 {
		return e.more[len(e.more)-1]
	}
	return e.frame
}

// handleAllButLast handles the frames of a batch but its last, one at a
// time with their actions, as if each had come alone; it returns the
// event of the last, and true if the request finished before it.
func (x *run) handleAllButLast(ctx context.Context, e event) (event, bool) {
	for len(e.more) > 0 {
		one := e
		one.more = nil
		if x.execAll(ctx, x.handle(one, time.Now())) {
			return e, true
		}
		e.frame, e.more = e.more[0], e.more[1:]
	}
	return e, false
}

// publish shows the client's writers the tokens delivered since the last
// publish: once per event the loop handled, however many tokens it
// delivered (a batch of frames wakes each writer once), and before any
// action that may wait (exec) or the end (finish).
func (x *run) publish() {
	if x.unpublished {
		x.unpublished = false
		x.st.publish(x.r.Output.View())
	}
}
