package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/kv/blockid"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
)

// CompletionRequest is the body of POST /v1/completions. Unknown fields are
// ignored, as OpenAI clients expect.
type CompletionRequest struct {
	Model       string   `json:"model"`
	Prompt      string   `json:"prompt"`
	MaxTokens   *int     `json:"max_tokens"`
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	TopK        int      `json:"top_k"`
	Seed        uint64   `json:"seed"`
	Stop        []string `json:"stop"`
	Stream      bool     `json:"stream"`
	// IgnoreEOS is an extension for benchmarks and tests.
	IgnoreEOS bool `json:"ignore_eos"`
	// TimeoutMs (extension; also the Lifeline-Timeout-Ms header) is the
	// request's deadline from its arrival: past it the request ends with
	// a typed deadline_exceeded error (504 before anything is streamed),
	// and a migration that cannot finish before it is not tried.
	TimeoutMs     int64 `json:"timeout_ms"`
	StreamOptions struct {
		// Resumable keeps the request running through a client disconnect
		// for the resume window.
		Resumable bool `json:"resumable"`
	} `json:"stream_options"`
	FrequencyPenalty float64 `json:"frequency_penalty"`
	PresencePenalty  float64 `json:"presence_penalty"`
	// Messages is the chat form (POST /v1/chat/completions).
	Messages []ChatMessage `json:"messages"`
}

// ChatMessage is one message of a chat completion request.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatTemplate renders messages for the reference model, which has no chat
// tokens of its own: "role: content" lines, then the assistant's turn.
func chatTemplate(msgs []ChatMessage) (string, error) {
	var b strings.Builder
	for i, m := range msgs {
		switch m.Role {
		case "system", "user", "assistant":
		default:
			return "", fmt.Errorf("messages[%d].role: %q (system, user or assistant)", i, m.Role)
		}
		b.WriteString(m.Role)
		b.WriteString(": ")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	b.WriteString("assistant:")
	return b.String(), nil
}

// event is what a request's run loop waits on.
type event struct {
	epoch    uint64
	frame    *wire.Frame
	from     Endpoint // the instance and generation the frame's stream was opened to
	err      error    // the worker stream broke
	failed   bool     // the instance was announced dead
	instance string
	gen      uint64 // the generation that died
	reason   string
	// P/D: a prefill's hand-off or failure, a transfer's answer.
	prefill  *prefillResult
	transfer *transferResult
}

type prefillResult struct {
	at  Endpoint
	kv  KVRef
	err error
}

type transferResult struct {
	transferEpoch uint64
	reply         *transferpb.PullReply
	err           error
}

// run drives one request's state machine.
type run struct {
	s      *Server
	r      *Request
	body   CompletionRequest
	st     *stream
	events chan event
	// failedAt is when the current migration began (zero when none).
	failedAt time.Time
	// overloaded is set once a worker refused the request as overloaded.
	overloaded  bool
	lastFailure string
	// timeline of the last migration: when the failure was seen, the new
	// worker chosen, the stream opened, and the first token committed.
	seen, routed, dispatched, recovered time.Time
	// streams cancels every worker call of each epoch (prefill, transfer,
	// decode); taken records the epochs whose decode stream opened.
	streams map[uint64]context.CancelFunc
	taken   map[uint64]bool
	on      string // instance currently serving
	// lastPrefill is the prefill instance that handed off last;
	// prefillNodes the nodes of prefill instances that failed this
	// request (they may have published blocks before dying).
	lastPrefill  string
	prefillNodes []string
	nodes        map[string]string // instance id → node, of instances used
	prefills     map[Endpoint]context.CancelFunc
	// P/D timeline of the current epoch.
	prefillSent, transferSent, decodeSent time.Time
	// promptTokens is the prompt under the built-in tokenizer (BOS
	// first; empty if it cannot be encoded); keys memoises prefixKeys per
	// KV identity, for keysAt received tokens.
	promptTokens []int
	keys         map[blockid.Identity][]blockid.BlockKey
	keysAt       int
}

// notify hands an announcement to the run loop without blocking the
// registry watcher; a lost announcement is caught by the stall timeout.
func (x *run) notify(e event) {
	select {
	case x.events <- e:
	default:
	}
}

// deliver hands a worker frame to the run loop, waiting while it is busy:
// a frame is never dropped. ctx is the worker stream's.
func (x *run) deliver(ctx context.Context, e event) {
	select {
	case x.events <- e:
	case <-ctx.Done():
	}
}

// stream is a request's token log as clients see it: every committed
// token, kept for resume, and a signal for the writers that follow it.
type stream struct {
	id        string
	body      CompletionRequest
	chat      bool
	resumable bool

	mu       sync.Mutex
	tokens   []Token
	done     bool
	r        *Request // read under mu once done
	timeline map[string]any
	// dispatched is closed once a worker has taken the request.
	dispatched     chan struct{}
	dispatchedOnce sync.Once
	changed        chan struct{}
	watchers       int
	idleAt         time.Time // when the last watcher left
	cancel         context.CancelFunc
}

func (st *stream) append(toks []Token) {
	st.mu.Lock()
	st.tokens = append(st.tokens, toks...)
	close(st.changed)
	st.changed = make(chan struct{})
	st.mu.Unlock()
}

// clientGone: a client that was waiting (not following) left. A plain
// request is cancelled; a resumable one runs on and, with nobody
// following it, is reaped after the resume window like any other.
func (st *stream) clientGone() {
	if !st.resumable {
		st.cancel()
		return
	}
	st.mu.Lock()
	if st.watchers == 0 {
		st.idleAt = time.Now()
	}
	st.mu.Unlock()
}

func (st *stream) finish(r *Request) {
	st.mu.Lock()
	st.done, st.r = true, r
	close(st.changed)
	st.changed = make(chan struct{})
	st.mu.Unlock()
}

func (s *Server) handleCompletions(w http.ResponseWriter, req *http.Request) { s.serve(w, req, false) }

func (s *Server) handleChat(w http.ResponseWriter, req *http.Request) { s.serve(w, req, true) }

func (s *Server) serve(w http.ResponseWriter, req *http.Request, chat bool) {
	var body CompletionRequest
	dec := json.NewDecoder(io.LimitReader(req.Body, 1<<20))
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, ErrInvalidRequest, "malformed JSON: "+err.Error())
		return
	}
	if h := req.Header.Get("Lifeline-Timeout-Ms"); h != "" && body.TimeoutMs == 0 {
		ms, err := strconv.ParseInt(h, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, ErrInvalidRequest, "Lifeline-Timeout-Ms: "+err.Error())
			return
		}
		body.TimeoutMs = ms
	}
	if chat {
		if len(body.Messages) == 0 {
			writeError(w, http.StatusBadRequest, ErrInvalidRequest, "messages: empty")
			return
		}
		p, err := chatTemplate(body.Messages)
		if err != nil {
			writeError(w, http.StatusBadRequest, ErrInvalidRequest, err.Error())
			return
		}
		body.Prompt = p
	}
	maxTokens := 16
	if body.MaxTokens != nil {
		maxTokens = *body.MaxTokens
	}
	switch {
	case body.Model == "":
		writeError(w, http.StatusBadRequest, ErrInvalidRequest, "model: required")
		return
	case maxTokens <= 0 || maxTokens > 1<<20:
		writeError(w, http.StatusBadRequest, ErrInvalidRequest, fmt.Sprintf("max_tokens: %d", maxTokens))
		return
	case body.Prompt == "":
		writeError(w, http.StatusBadRequest, ErrInvalidRequest, "prompt: empty")
		return
	case body.TimeoutMs < 0 || body.TimeoutMs > 24*3600*1000:
		writeError(w, http.StatusBadRequest, ErrInvalidRequest, fmt.Sprintf("timeout_ms: %d (0 for none, at most a day)", body.TimeoutMs))
		return
	case !s.knownModel(body.Model):
		writeError(w, http.StatusNotFound, ErrInvalidRequest, fmt.Sprintf("model: %q is not served here", body.Model))
		return
	}
	s.mu.Lock()
	s.nextID++
	id := fmt.Sprintf("cmpl-%d-%d", time.Now().UnixNano(), s.nextID)
	s.mu.Unlock()
	now := time.Now()
	// The prompt's length in tokens is not known here; estimate it for the
	// deadline check from its bytes.
	var deadline time.Time
	if body.TimeoutMs > 0 {
		deadline = now.Add(time.Duration(body.TimeoutMs) * time.Millisecond)
	}
	r := NewRequest(id, make([]int, len(body.Prompt)/4+1), maxTokens, deadline, s.opts.Policy, now)
	resumable := body.StreamOptions.Resumable || req.Header.Get("Lifeline-Resumable") == "1"
	// The request lives on the server, not on this connection: a resumable
	// one survives the client's disconnect.
	rctx, cancel := context.WithCancel(s.ctx)
	st := &stream{id: id, body: body, chat: chat, resumable: resumable, changed: make(chan struct{}), cancel: cancel, dispatched: make(chan struct{})}
	s.mu.Lock()
	s.streams[id] = st
	s.mu.Unlock()
	x := &run{s: s, r: r, body: body, st: st, events: make(chan event, 1024), streams: map[uint64]context.CancelFunc{}, taken: map[uint64]bool{}, nodes: map[string]string{}, keys: map[blockid.Identity][]blockid.BlockKey{},
		prefills: map[Endpoint]context.CancelFunc{}}
	go x.loop(rctx)

	w.Header().Set("Lifeline-Request-Id", id)
	w.Header().Set("Lifeline-Resume-Token", s.keys.Issue(id, now.Add(s.resumeWindow()+time.Hour)))
	if !body.Stream {
		s.writeWhole(w, req, st)
		return
	}
	// Answer with an HTTP status while nothing is streamed yet: a request
	// no worker took ends as a plain 4xx/5xx.
	for {
		st.mu.Lock()
		done, r, changed := st.done, st.r, st.changed
		st.mu.Unlock()
		if done && r.Err != nil && len(r.Output) == 0 {
			writeRequestError(w, r.Err)
			return
		}
		if done {
			break
		}
		select {
		case <-st.dispatched:
		case <-changed:
			continue
		case <-req.Context().Done():
			st.clientGone()
			return
		}
		break
	}
	s.follow(w, req, st, 0, true)
}

// follow writes the stream's tokens after sequence number from, then its
// end. When the client that made a request that did not ask to be
// resumable (owner) goes away, the request is cancelled.
func (s *Server) follow(w http.ResponseWriter, req *http.Request, st *stream, from int, owner bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	flusher, _ := w.(http.Flusher)
	st.mu.Lock()
	st.watchers++
	st.mu.Unlock()
	// gone is set when the client went away (a failed write or its
	// context): the request context may not be cancelled yet at that point.
	gone := false
	defer func() {
		st.mu.Lock()
		st.watchers--
		st.idleAt = time.Now()
		done := st.done
		st.mu.Unlock()
		// A plain request lives as long as the connection that made it;
		// followers that resumed it do not keep it alive.
		if !done && !st.resumable && owner && (gone || req.Context().Err() != nil) {
			st.cancel()
		}
	}()
	// Send the headers (request id, resume token) before the first token:
	// a client cut off during the prefill can still resume.
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprint(w, ": lifeline\n\n"); err != nil {
		gone = true
		return
	}
	if flusher != nil {
		flusher.Flush()
	}
	next := from + 1
	for {
		st.mu.Lock()
		toks := append([]Token(nil), st.tokens[min(next-1, len(st.tokens)):]...)
		done, r, changed := st.done, st.r, st.changed
		st.mu.Unlock()
		for _, t := range toks {
			chunk, _ := json.Marshal(st.chunk(t.Text, nil, tokenInfo{RequestID: st.id, SequenceNo: t.SequenceNo, TokenID: t.ID, InstanceID: t.instance}))
			if _, err := fmt.Fprintf(w, "id: %d\ndata: %s\n\n", t.SequenceNo, chunk); err != nil {
				gone = true
				return
			}
			next = t.SequenceNo + 1
		}
		if flusher != nil && len(toks) > 0 {
			flusher.Flush()
		}
		if done {
			st.writeEnd(w, flusher, r)
			return
		}
		select {
		case <-changed:
		case <-req.Context().Done():
			gone = true
			return
		}
	}
}

func (s *Server) writeWhole(w http.ResponseWriter, req *http.Request, st *stream) {
	st.mu.Lock()
	st.watchers++
	st.mu.Unlock()
	defer func() {
		st.mu.Lock()
		st.watchers--
		st.idleAt = time.Now()
		st.mu.Unlock()
	}()
	for {
		st.mu.Lock()
		done, r, changed := st.done, st.r, st.changed
		st.mu.Unlock()
		if done {
			if r.Err != nil {
				writeRequestError(w, r.Err)
				return
			}
			var text strings.Builder
			for _, t := range r.Output {
				text.WriteString(t.Text)
			}
			ll := lifelineInfo(r)
			ll["tokens"] = len(r.Output)
			usage := map[string]any{"completion_tokens": len(r.Output)}
			if st.chat {
				writeJSON(w, http.StatusOK, map[string]any{"id": r.ID, "object": "chat.completion", "model": st.body.Model, "usage": usage,
					"choices":  []map[string]any{{"index": 0, "message": map[string]any{"role": "assistant", "content": text.String()}, "finish_reason": r.FinishReason}},
					"lifeline": ll})
				return
			}
			writeJSON(w, http.StatusOK, map[string]any{"id": r.ID, "object": "text_completion", "model": st.body.Model, "usage": usage,
				"choices":  []map[string]any{{"index": 0, "text": text.String(), "finish_reason": r.FinishReason}},
				"lifeline": ll})
			return
		}
		select {
		case <-changed:
		case <-req.Context().Done():
			st.clientGone()
			return
		}
	}
}

func writeRequestError(w http.ResponseWriter, e *RequestError) {
	code := http.StatusInternalServerError
	switch e.Type {
	case ErrNoCapacity, ErrMigrationExhausted:
		code = http.StatusServiceUnavailable
	case ErrOverloaded:
		code = http.StatusTooManyRequests
	case ErrInvalidRequest:
		code = http.StatusBadRequest
	case ErrDeadlineExceeded:
		code = http.StatusGatewayTimeout
	case ErrCancelledType:
		code = 499
	}
	writeError(w, code, e.Type, e.Message)
}

// chunk renders one streamed piece in the completion or chat shape.
// sseChunk is one streamed piece in the completion or chat shape; typed,
// so the per-token encoding builds no maps.
type sseChunk struct {
	ID       string       `json:"id"`
	Object   string       `json:"object"`
	Model    string       `json:"model"`
	Choices  [1]sseChoice `json:"choices"`
	Lifeline any          `json:"lifeline"`
}

type sseChoice struct {
	Index        int       `json:"index"`
	Text         *string   `json:"text,omitempty"`  // completions
	Delta        *sseDelta `json:"delta,omitempty"` // chat
	FinishReason any       `json:"finish_reason"`
}

type sseDelta struct {
	Content string `json:"content,omitempty"`
}

// tokenInfo is the lifeline object of a token's chunk.
type tokenInfo struct {
	RequestID  string `json:"request_id"`
	SequenceNo int    `json:"sequence_no"`
	TokenID    int    `json:"token_id"`
	InstanceID string `json:"instance_id"`
}

func (st *stream) chunk(text string, finish any, lifeline any) sseChunk {
	c := sseChunk{ID: st.id, Object: "text_completion", Model: st.body.Model, Lifeline: lifeline}
	c.Choices[0].FinishReason = finish
	if st.chat {
		c.Object = "chat.completion.chunk"
		c.Choices[0].Delta = &sseDelta{Content: text}
	} else {
		c.Choices[0].Text = &text
	}
	return c
}

// writeEnd ends a stream whose headers are sent: an error event or the
// final chunk, then [DONE].
func (st *stream) writeEnd(w http.ResponseWriter, flusher http.Flusher, r *Request) {
	if r.Err != nil {
		b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": r.Err.Message, "type": r.Err.Type}})
		fmt.Fprintf(w, "data: %s\n\n", b)
	} else {
		ll := lifelineInfo(r)
		if st.timeline != nil {
			ll["last_migration"] = st.timeline
		}
		b, _ := json.Marshal(st.chunk("", r.FinishReason, ll))
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// lifelineInfo is the "lifeline" object of a finished response.
func lifelineInfo(r *Request) map[string]any {
	ll := map[string]any{"request_id": r.ID, "migrations": r.Migrations, "kv_reused_positions": r.ReusedPositions}
	if r.PD != "" {
		ll["pd"] = r.PD
		ll["kv_transfer_bytes"] = r.TransferBytes
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		ll["pd_timeline_ms"] = map[string]float64{"prefill": ms(r.PrefillTime), "transfer": ms(r.TransferTime), "decode_first_token": ms(r.DecodeFirstToken)}
	}
	return ll
}

// loop drives the request's state machine until it ends.
func (x *run) loop(ctx context.Context) {
	r := x.r
	defer x.cancelAll()
	acts := r.Start(time.Now())
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var deadline <-chan time.Time
	if !r.Deadline.IsZero() {
		t := time.NewTimer(time.Until(r.Deadline))
		defer t.Stop()
		deadline = t.C
	}
	cancelled := false
	for {
		for len(acts) > 0 {
			a := acts[0]
			acts = acts[1:]
			switch a := a.(type) {
			case Route:
				if r.State == Migrating {
					x.s.log.Warn("migrating", "request_id", r.ID, "request_epoch", r.Epoch, "attempt", r.Migrations,
						"sequence_no", r.Received(), "failure_reason", x.lastFailure, "recovery_action", "re-prefill elsewhere")
					x.s.metrics.migrations.WithLabelValues("attempt").Inc()
					if x.failedAt.IsZero() {
						x.failedAt = time.Now()
						x.seen, x.recovered = x.failedAt, time.Time{}
					}
				}
				acts = append(acts, x.route(a)...)
				if r.State == Prefilling && !x.failedAt.IsZero() {
					x.routed = time.Now()
				}
			case Dispatch:
				x.s.log.Info("dispatch", "request_id", r.ID, "request_epoch", a.Epoch, "instance_id", a.To.InstanceID,
					"generation", a.To.Generation, "sequence_no", len(a.Prefix))
				x.s.metrics.replayedPrefill.Add(float64(len(a.Prefix)))
				x.decodeSent = time.Now()
				acts = append(acts, x.dispatch(ctx, a)...)
				if x.taken[a.Epoch] {
					x.st.dispatchedOnce.Do(func() { close(x.st.dispatched) })
				}
				if !x.failedAt.IsZero() {
					x.dispatched = time.Now()
				}
			case Deliver:
				x.overloaded = false
				if r.PD != "" && r.DecodeFirstToken == 0 && len(r.Output) == len(a.Tokens) {
					r.DecodeFirstToken = time.Since(x.decodeSent)
				}
				if !x.failedAt.IsZero() {
					x.s.metrics.migrations.WithLabelValues("success").Inc()
					x.s.metrics.migrationTime.Observe(time.Since(x.failedAt).Seconds())
					x.failedAt = time.Time{}
					x.recovered = time.Now()
				}
				x.st.append(a.Tokens)
			case Prefill:
				x.prefillSent = time.Now()
				x.s.log.Info("prefill", "request_id", r.ID, "request_epoch", a.Epoch, "instance_id", a.At.InstanceID, "generation", a.At.Generation)
				acts = append(acts, x.prefill(ctx, a)...)
			case PrefillFailed:
				// Every way a prefill instance fails (stream error, death
				// announcement, stall) ends up here once.
				x.s.metrics.prefillFailures.Inc()
				x.prefillNodes = append(x.prefillNodes, x.nodeOf(a.At.InstanceID))
				x.endPrefill(a.At)
				x.s.dropClient(a.At)
			case RoutePrefill:
				acts = append(acts, x.routePrefill(a)...)
			case Transfer:
				x.transferSent = time.Now()
				x.s.log.Info("kv transfer", "request_id", r.ID, "request_epoch", a.Epoch, "transfer_epoch", a.TransferEpoch,
					"instance_id", a.To.InstanceID, "from_node", a.KV.Node, "blocks", len(a.KV.Keys))
				x.transfer(ctx, a)
			case CancelWorker:
				if c, ok := x.streams[a.Epoch]; ok {
					c()
					delete(x.streams, a.Epoch)
				}
			case Finish:
				if r.Err != nil {
					x.s.log.Warn("request failed", "request_id", r.ID, "request_epoch", r.Epoch, "failure_reason", r.Err.Type, "attempt", r.Migrations)
				}
				x.s.metrics.settle(r)
				if !x.recovered.IsZero() {
					x.st.timeline = map[string]any{"failure_seen_unix_ns": x.seen.UnixNano(), "routed_unix_ns": x.routed.UnixNano(),
						"dispatched_unix_ns": x.dispatched.UnixNano(), "first_token_unix_ns": x.recovered.UnixNano()}
				}
				x.st.finish(r)
				x.s.forgetLater(x.st)
				return
			}
		}
		select {
		case <-ctx.Done():
			if cancelled {
				acts = r.CancelDone()
				continue
			}
			cancelled = true
			acts = append(r.Cancel(), r.CancelDone()...)
		case e := <-x.events:
			now := time.Now()
			switch {
			case e.failed:
				x.lastFailure = e.reason
				if e.instance == r.PrefillAt.InstanceID && (e.gen == 0 || r.PrefillAt.Generation <= e.gen) {
					acts = r.OnPrefillFailed(r.Epoch, r.PrefillAt, e.reason)
				}
				if e.instance == r.Endpoint.InstanceID && (e.gen == 0 || r.Endpoint.Generation <= e.gen) {
					acts = append(acts, r.OnWorkerFailed(r.Epoch, e.reason, true, now)...)
				}
			case e.prefill != nil:
				if e.prefill.err != nil {
					x.lastFailure = e.prefill.err.Error()
					x.endPrefill(e.prefill.at) // a stale one too
					acts = r.OnPrefillFailed(e.epoch, e.prefill.at, e.prefill.err.Error())
					break
				}
				acts = r.OnPrefilled(e.epoch, e.prefill.kv, e.prefill.kv.Node == x.nodeOf(r.Endpoint.InstanceID), now)
				if len(acts) > 0 { // accepted: the hand-off of the current prefill
					x.endPrefill(e.prefill.at)
					x.lastPrefill = e.prefill.at.InstanceID
					r.PrefillTime = time.Since(x.prefillSent)
					if _, ok := acts[0].(Dispatch); ok {
						x.s.metrics.pd.WithLabelValues(r.PD).Inc()
					}
				}
			case e.transfer != nil:
				if e.epoch == r.Epoch && e.transfer.transferEpoch == r.TransferEpoch && r.State == Transferring {
					r.TransferTime = time.Since(x.transferSent)
					tr := e.transfer
					switch {
					case tr.err != nil || tr.reply.Error != "":
						why := fmt.Sprint(tr.err)
						if tr.err == nil {
							why = tr.reply.Error
						}
						x.s.log.Warn("kv transfer failed; decode recomputes", "request_id", r.ID, "request_epoch", r.Epoch, "err", why)
						x.s.metrics.pd.WithLabelValues("transfer_failed").Inc()
						r.PD = "transfer_failed"
					default:
						x.s.metrics.pd.WithLabelValues("transfer").Inc()
						x.s.metrics.transferBytes.Add(float64(tr.reply.Bytes))
						r.PD, r.TransferBytes = "transfer", tr.reply.Bytes
					}
				}
				acts = r.OnTransferred(e.epoch, e.transfer.transferEpoch, now)
			case e.err != nil:
				x.lastFailure = e.err.Error()
				acts = r.OnWorkerFailed(e.epoch, e.err.Error(), true, now)
			case e.frame.Error != nil:
				if e.frame.Error.Code == wire.Code_OVERLOADED && r.Received() == 0 {
					// Busy, not broken: try elsewhere without spending the
					// migration budget, and answer 429 if every instance is.
					x.overloaded = true
					acts = r.OnOverloaded(e.epoch)
					break
				}
				acts = r.OnWorkerFailed(e.epoch, e.frame.Error.Message, e.frame.Error.Retryable, now)
			default:
				f := e.frame
				acts = r.OnFrame(Frame{From: e.from, Epoch: f.RequestEpoch, SequenceNo: int(f.SequenceNo),
					TokenID: int(f.TokenId), Text: f.Text, FinishReason: f.FinishReason, ReusedPositions: int(f.ReusedPositions)}, now)
			}
		case <-deadline:
			acts = r.OnDeadline(time.Now())
		case <-tick.C:
			acts = r.Tick(time.Now())
			x.s.reapIdle(x.st)
		}
	}
}

// tokenize encodes the prompt with the built-in tokenizer once per
// request, for prefixKeys.
func (x *run) tokenize() {
	if x.promptTokens != nil {
		return
	}
	tok := tokenizer.NewBuiltin()
	ids, err := tok.Encode(x.body.Prompt)
	if err != nil {
		x.promptTokens = []int{}
		return
	}
	x.promptTokens = append([]int{tok.BOS()}, ids...)
}

func (x *run) route(a Route) []Action {
	s := x.s
	x.tokenize() // outside the lock: a long prompt takes a while
	s.mu.Lock()
	prefer := ""
	if prev, ok := s.router.instances[x.on]; ok {
		prefer = prev.NumericsID
	}
	in, cached, used, err := s.router.PickCached(x.body.Model, "", prefer, a.Exclude, time.Now(), x.prefixKeys)
	var p Instance
	var perr error = ErrNoInstance
	// Split prefill from decode while nothing is generated yet and a
	// prefill instance with the decode instance's numerics is there —
	// unless the decode instance's node already holds the whole prompt.
	whole := len(x.prefixKeys(in)) > 0 && cached >= len(x.prefixKeys(in))
	if err == nil && x.r.Received() == 0 && x.r.PrefillFailures < MaxPrefillAttempts && !whole {
		p, perr = s.router.PickPrefill(x.body.Model, in.ModelRevision, in.NumericsID, a.Exclude, time.Now(), x.prefixKeys)
	}
	hasPrefill := s.router.HasPrefill(x.body.Model)
	s.mu.Unlock()
	if err != nil {
		return x.r.NoRoute(a.Epoch, x.overloaded)
	}
	switch {
	case cached > 0:
		s.metrics.cacheRoutes.WithLabelValues("hit").Inc()
	case used:
		s.metrics.cacheRoutes.WithLabelValues("miss").Inc()
	default:
		s.metrics.cacheRoutes.WithLabelValues("load_only").Inc()
	}
	if perr == nil {
		return x.r.RoutedPD(a.Epoch, Endpoint{in.ID, in.Generation}, Endpoint{p.ID, p.Generation}, time.Now())
	}
	if hasPrefill && x.r.Received() == 0 {
		s.metrics.pd.WithLabelValues("no_prefill").Inc()
	}
	return x.r.Routed(a.Epoch, Endpoint{in.ID, in.Generation}, time.Now())
}

// prefixKeys are the block keys of prompt ‖ received tokens under in's KV
// identity, when this frontend tokenizes the way in does (the built-in
// tokenizer); nil otherwise, and routing for in is by load only.
func (x *run) prefixKeys(in Instance) []blockid.BlockKey {
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
		return nil // route tokenizes before it takes the server's lock
	}
	tokens := slices.Clone(x.promptTokens)
	for _, t := range x.r.Output {
		tokens = append(tokens, t.ID)
	}
	keys := id.Chain(tokens, (len(tokens)-1)/id.BlockSize)
	x.keys[*id] = keys
	return keys
}

func (x *run) routePrefill(a RoutePrefill) []Action {
	s := x.s
	s.mu.Lock()
	d := s.router.instances[x.r.Endpoint.InstanceID]
	p, err := s.router.PickPrefill(x.body.Model, d.ModelRevision, d.NumericsID, a.Exclude, time.Now(), x.prefixKeys)
	s.mu.Unlock()
	if err != nil {
		s.metrics.pd.WithLabelValues("no_prefill").Inc()
	}
	return x.r.PrefillRouted(a.Epoch, Endpoint{p.ID, p.Generation}, err == nil, time.Now())
}

// endPrefill cancels the prefill call to at, if one is open.
func (x *run) endPrefill(at Endpoint) {
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
	x.s.mu.Lock()
	defer x.s.mu.Unlock()
	n := x.s.router.instances[id].Node
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
	if b.Temperature != nil {
		g.Temperature = *b.Temperature
	}
	if b.TopP != nil {
		g.TopP = *b.TopP
	}
	return g
}

// prefill sends the prompt to the prefill instance; its hand-off (or
// failure) comes back as an event.
func (x *run) prefill(ctx context.Context, a Prefill) []Action {
	s := x.s
	failed := func(err error) []Action { return x.r.OnPrefillFailed(a.Epoch, a.At, err.Error()) }
	c, err := s.client(ctx, a.At)
	if err != nil {
		return failed(err)
	}
	g := x.generateRequest(a.Epoch, nil)
	g.PrefillOnly = true
	// A prefill has its own cancel (a failed one is abandoned while the
	// epoch goes on), under the epoch's.
	if len(x.prefillNodes) > 0 {
		// An earlier prefill instance died: what it published on its
		// node is pulled, not computed again.
		s.mu.Lock()
		g.KvSources = s.router.KVSources(x.prefillNodes, s.router.instances[a.At.InstanceID].Node)
		s.mu.Unlock()
	}
	pctx, cancel := context.WithCancel(x.epochCtx(ctx, a.Epoch))
	x.prefills[a.At] = cancel
	st, err := c.Generate(pctx, g)
	if err != nil {
		return failed(err)
	}
	node := x.nodeOf(a.At.InstanceID)
	s.mu.Lock()
	kvAddr := s.router.instances[a.At.InstanceID].KVAddr
	// Announcements of either instance's death reach this run: the
	// decode instance is chosen already, and may die while P works.
	for _, id := range []string{a.At.InstanceID, x.r.Endpoint.InstanceID} {
		if s.active[id] == nil {
			s.active[id] = map[*run]struct{}{}
		}
		s.active[id][x] = struct{}{}
	}
	s.mu.Unlock()
	go func() {
		res := &prefillResult{at: a.At}
		for {
			f, err := st.Next()
			switch {
			case err != nil && errors.Is(err, io.EOF):
				res.err = fmt.Errorf("prefill stream ended without a hand-off")
			case err != nil:
				res.err = err
			case f.Error != nil:
				res.err = fmt.Errorf("prefill: %s", f.Error.Message)
			case f.FinishReason == "prefilled":
				res.kv = KVRef{From: a.At, Node: node, KVAddr: kvAddr, Keys: f.KvKeys}
			case f.FinishReason != "":
				res.err = fmt.Errorf("prefill ended with %q", f.FinishReason)
			default:
				continue
			}
			if pctx.Err() == nil {
				x.deliver(pctx, event{epoch: a.Epoch, prefill: res})
			}
			return
		}
	}()
	return nil
}

// TransferTimeout bounds a P/D hand-off's pull.
const TransferTimeout = 5 * time.Second

// transfer asks the decode instance's node to pull the prompt's blocks
// from the prefill node; the answer comes back as an event.
func (x *run) transfer(ctx context.Context, a Transfer) {
	s := x.s
	s.mu.Lock()
	d := s.router.instances[a.To.InstanceID]
	sources := s.router.KVSources([]string{a.KV.Node}, d.Node)
	s.mu.Unlock()
	b := &transferpb.Binding{RequestId: x.r.ID, ModelRevision: d.ModelRevision, SourceInstance: a.KV.From.InstanceID,
		SourceGeneration: a.KV.From.Generation, DestinationInstance: a.To.InstanceID, DestinationGeneration: a.To.Generation,
		FirstBlock: 0, BlockCount: uint32(len(a.KV.Keys)), RequestEpoch: a.Epoch, TransferEpoch: a.TransferEpoch}
	tctx := x.epochCtx(ctx, a.Epoch)
	go func() {
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
	}()
}

func (x *run) dispatch(ctx context.Context, d Dispatch) []Action {
	s := x.s
	// Pick only returns ready instances; this counts any that the view
	// marked not ready between the pick and the send.
	s.mu.Lock()
	if in, ok := s.router.instances[d.To.InstanceID]; ok && !in.Ready {
		s.metrics.notReadyRouted.Inc()
	}
	s.mu.Unlock()
	c, err := s.client(ctx, d.To)
	if err != nil {
		return x.r.OnWorkerFailed(d.Epoch, err.Error(), true, time.Now())
	}
	fail := func(err error) []Action {
		s.dropClient(d.To)
		return x.r.OnWorkerFailed(d.Epoch, err.Error(), true, time.Now())
	}
	g := x.generateRequest(d.Epoch, d.Prefix)
	if (len(d.Prefix) > 0 || len(x.prefillNodes) > 0) && !s.opts.NoKVPull {
		// A migration, or a prefill instance died: the blocks of prompt ‖
		// prefix may be published on the node of the instance that failed
		// (its agent outlives it) or of a prefill instance; the new worker
		// pulls what its node lacks.
		first := append([]string{x.nodeOf(x.on), x.nodeOf(x.lastPrefill)}, x.prefillNodes...)
		s.mu.Lock()
		g.KvSources = s.router.KVSources(first, s.router.instances[d.To.InstanceID].Node)
		s.mu.Unlock()
	}
	sctx := x.epochCtx(ctx, d.Epoch)
	st, err := c.Generate(sctx, g)
	if err != nil {
		return fail(err)
	}
	x.taken[d.Epoch] = true
	x.on = d.To.InstanceID
	x.nodeOf(x.on)
	s.mu.Lock()
	if s.active[x.on] == nil {
		s.active[x.on] = map[*run]struct{}{}
	}
	s.active[x.on][x] = struct{}{}
	s.mu.Unlock()
	go func(epoch uint64, to Endpoint) {
		for {
			f, err := st.Next()
			if err != nil {
				if sctx.Err() == nil {
					if errors.Is(err, io.EOF) {
						err = fmt.Errorf("worker stream ended without a finish")
					}
					x.deliver(sctx, event{epoch: epoch, err: err})
				}
				return
			}
			x.deliver(sctx, event{epoch: epoch, frame: f, from: to})
			if f.FinishReason != "" {
				return
			}
		}
	}(d.Epoch, d.To)
	return nil
}

func (x *run) cancelAll() {
	for _, c := range x.streams {
		c()
	}
	x.s.mu.Lock()
	for _, runs := range x.s.active {
		delete(runs, x)
	}
	x.s.mu.Unlock()
}
