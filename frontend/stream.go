package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/route"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// stream is a request's token log as clients see it: every committed
// token, kept for resume, and a signal for the writers that follow it.
type stream struct {
	id        string
	body      CompletionRequest
	chat      bool
	resumable bool

	mu     sync.Mutex
	tokens reqfsm.TokenLog // a view of the request's Output (publish)
	done   bool
	r      *reqfsm.Request // read under mu once done
	end    sse.Lifeline    // the request's summary, set once done
	// dispatched is closed once a worker has taken the request.
	dispatched     chan struct{}
	dispatchedOnce sync.Once
	changed        chan struct{}
	watchers       int
	idleAt         time.Time // when the last watcher left
	// cancel ends the request with a cause: a *clientCancel when its
	// client ended it.
	cancel context.CancelCauseFunc
	// rec is the stream's request record as this frontend owns it (nil:
	// none is written).
	rec *recordState
	// created is the admission, in unix seconds.
	created int64
	// router tells the serving instance's facts (nil in unit tests);
	// facts is what it told, under mu.
	router *route.Router
	facts  responseFacts
	// promptLen is the prompt's length in tokens as the run encoded it
	// (0: not known), under mu.
	promptLen int
	// workerPromptLen is the prompt's length as the serving worker's
	// finish frame says (its model's tokenizer; 0: not said).
	workerPromptLen int
}

// clientCancel is the cause of a request's end that its client chose: a
// DELETE, or its disconnect. Any other end of the request's context (the
// frontend stopping) is not reported as a cancel.
type clientCancel struct{ why string }

func (c *clientCancel) Error() string { return c.why }

var (
	errClientCancelled = &clientCancel{"cancelled by the client"}
	errClientGone      = &clientCancel{"the client disconnected"}
	errNotFollowed     = &clientCancel{"no client followed the stream for the resume window"}
)

func isClientCancel(err error) bool {
	var c *clientCancel
	return errors.As(err, &c)
}

func newStream(id string, body CompletionRequest, chat, resumable bool, cancel context.CancelCauseFunc) *stream {
	return &stream{id: id, body: body, chat: chat, resumable: resumable, changed: make(chan struct{}), cancel: cancel, dispatched: make(chan struct{}),
		created: time.Now().Unix()}
}

// publish makes the log out, the request's output so far: a view of it
// (tokenLog.view). The machine's Output only ever grows (a token in it
// never changes), so the log shares it rather than holding a second copy
// of every token.
func (st *stream) publish(out reqfsm.TokenLog) {
	st.mu.Lock()
	st.tokens = out
	close(st.changed)
	st.changed = make(chan struct{})
	st.mu.Unlock()
}

// taken records that a worker has taken the request.
func (st *stream) taken() { st.dispatchedOnce.Do(func() { close(st.dispatched) }) }

// clientGone: a client that was waiting (not following) left. A plain
// request is cancelled; a resumable one runs on and, with nobody
// following it, is reaped after the resume window like any other.
func (st *stream) clientGone() {
	if !st.resumable {
		st.cancel(errClientGone)
		return
	}
	st.mu.Lock()
	if st.watchers == 0 {
		st.idleAt = time.Now()
	}
	st.mu.Unlock()
}

// finish ends the log: r is the finished request, end its summary.
func (st *stream) finish(r *reqfsm.Request, end sse.Lifeline) {
	st.mu.Lock()
	st.done, st.r, st.end = true, r, end
	close(st.changed)
	st.changed = make(chan struct{})
	st.mu.Unlock()
}

// watch counts a writer following the stream; the returned func ends it
// and reports whether the stream was done by then.
func (st *stream) watch() (unwatch func() (done bool)) {
	st.mu.Lock()
	st.watchers++
	st.mu.Unlock()
	return func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		st.watchers--
		st.idleAt = time.Now()
		return st.done
	}
}

// state is whether the log is done (and the request then), and the signal
// of its next change.
func (st *stream) state() (done bool, r *reqfsm.Request, changed chan struct{}) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.done, st.r, st.changed
}

// snapshot is the log: its tokens so far, whether it is done (and the
// request then), and the signal of its next change.
func (st *stream) snapshot() (toks reqfsm.TokenLog, done bool, r *reqfsm.Request, changed chan struct{}) {
	st.mu.Lock()
	defer st.mu.Unlock()
	// No copy: the log only grows, and what is in it never changes.
	return st.tokens, st.done, st.r, st.changed
}

// awaitStart waits until a worker has sent the request's first token, or
// it ended, or the client left (false; the client's leaving is handled). A
// request that ended before streaming anything returns its error, to be
// answered with an HTTP status: a worker validates a request (its
// context, its vocabulary) before its first token, and a refusal is a
// 400, never an error event after a 200.
func (st *stream) awaitStart(ctx context.Context) (*reqfsm.RequestError, bool) {
	for {
		toks, done, r, changed := st.snapshot()
		if done && r.Err != nil && r.Output.Len() == 0 {
			return r.Err, true
		}
		if done || toks.Len() > 0 {
			return nil, true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			st.clientGone()
			return nil, false
		}
	}
}

// follow writes the stream's tokens after sequence number from, then its
// end. When the client that made a request that did not ask to be
// resumable (owner) goes away, the request is cancelled.
func (s *Server) follow(w http.ResponseWriter, req *http.Request, st *stream, from int, owner bool) {
	st.useRouter(s.router)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w, unslow := s.slow.watch(w)
	unwatch := st.watch()
	// gone is set when the client went away (a failed write or its
	// context): the request context may not be cancelled yet at that point.
	gone := false
	defer func() {
		unslow()
		done := unwatch()
		// A plain request lives as long as the connection that made it;
		// followers that resumed it do not keep it alive.
		if !done && !st.resumable && owner && (gone || req.Context().Err() != nil) {
			st.cancel(errClientGone)
		}
	}()
	// The status line: a new request's comes once its first token is
	// there and its record stored (serve), so that its resume token works
	// at every frontend and no token reaches the client before.
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	sw := sse.NewWriter(w)
	if err := sw.WriteComment("lifeline"); err != nil {
		gone = true
		return
	}
	if flusher != nil {
		flusher.Flush()
	}
	p := newPulse(s.beat, sw, flusher)
	if st.body.Response != nil {
		// A response's events: from is the sequence number after which
		// the client resumes (-1: from the start).
		gone = !st.writeResponseFrom(req.Context(), sw, flusher, from, p)
		return
	}
	gone = !st.writeFrom(req.Context(), sw, flusher, from, p)
}

// writeFrom writes the log after sequence number from as it grows, then its
// end; false when the client went away first.
func (st *stream) writeFrom(ctx context.Context, sw *sse.Writer, flusher http.Flusher, from int, p *pulse) bool {
	if st.body.ToolCalls != nil {
		return st.writeCallsFrom(ctx, sw, flusher, from, p)
	}
	next, offset := from+1, -1
	for {
		toks, done, r, changed := st.snapshot()
		wrote := false
		for t := range toks.From(next - 1) {
			c := st.tokenChunk(t, &offset)
			if err := sw.WriteChunk(&c); err != nil {
				return false
			}
			next, wrote = t.SequenceNo+1, true
		}
		if wrote {
			if flusher != nil {
				flusher.Flush()
			}
			p.sent()
		}
		if done {
			st.writeEnd(sw, flusher, r)
			return true
		}
		if !p.await(ctx, changed) {
			return false
		}
	}
}

// chunk is one streamed piece in the completion or chat shape; finish is
// nil until the end chunk.
func (st *stream) chunk(text string, finish *string, ll sse.Lifeline) sse.Chunk {
	c := sse.Chunk{ID: st.id, Object: "text_completion", Created: st.created, Model: st.body.Model, Lifeline: ll,
		SystemFingerprint: st.meta(ll.InstanceID)}
	c.Choices[0].FinishReason = finish
	if st.chat {
		c.Object = "chat.completion.chunk"
		c.Choices[0].Delta = &sse.Delta{Content: text}
		if ll.SequenceNo == 1 {
			c.Choices[0].Delta.Role = "assistant"
		}
	} else {
		c.Choices[0].Text = &text
	}
	return c
}

// writeEnd ends a stream whose headers are sent: an error event or the
// final chunk, then [DONE].
func (st *stream) writeEnd(sw *sse.Writer, flusher http.Flusher, r *reqfsm.Request) {
	if r.Err != nil && r.Err.Type == openai.ErrTakenOver && st.rec != nil {
		// Not the end of the stream: it goes on at the new owner, where
		// the client resumes. No [DONE].
		st.rec.mu.Lock()
		url := st.rec.movedTo
		st.rec.mu.Unlock()
		sw.WriteError(sse.Error{Message: r.Err.Message, Type: string(r.Err.Type), OwnerURL: url})
		if flusher != nil {
			flusher.Flush()
		}
		return
	}
	if r.Err != nil {
		sw.WriteError(sse.Error{Message: r.Err.Message, Type: string(r.Err.Type)})
	} else {
		finish := st.finishReason(r)
		c := st.chunk(st.endText(r), &finish, st.endSummary())
		sw.WriteChunk(&c)
		if st.body.StreamOptions.IncludeUsage {
			c.Usage = st.usage(r.Output.Len())
			sw.WriteUsage(&c)
		}
	}
	sw.WriteDone()
	if flusher != nil {
		flusher.Flush()
	}
}

// writeWhole answers a request that did not ask to be streamed, once it
// has ended.
func (s *Server) writeWhole(w http.ResponseWriter, req *http.Request, st *stream) {
	st.useRouter(s.router)
	defer st.watch()()
	for {
		done, r, changed := st.state()
		if done {
			st.writeCompletion(w, r)
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

// writeCompletion writes a finished request as one response in the
// completion or chat shape.
func (st *stream) writeCompletion(w http.ResponseWriter, r *reqfsm.Request) {
	if r.Err != nil {
		writeRequestErrorFor(w, r.Err, &st.body)
		return
	}
	ll := wholeLifeline{Lifeline: st.endSummary(), Tokens: r.Output.Len()}
	serving := r.Endpoint.InstanceID
	if r.Output.Len() > 0 {
		serving = r.Output.LastInstance()
	}
	out := map[string]any{"id": r.ID, "object": "text_completion", "created": st.created, "model": st.body.Model,
		"system_fingerprint": st.meta(serving), "usage": st.usage(r.Output.Len()), "lifeline": ll}
	if st.chat {
		out["object"] = "chat.completion"
	}
	out["choices"] = []map[string]any{st.wholeChoice(r)}
	writeJSON(w, http.StatusOK, out)
}

// endSummary is the end chunk's lifeline object: the request's summary,
// with the seed when it was drawn at admission.
func (st *stream) endSummary() sse.Lifeline {
	end := st.end
	if st.body.SeedDrawn {
		end.Seed = &st.body.Seed
	}
	return end
}

// useRouter lets the stream learn its serving instance's facts.
func (st *stream) useRouter(rt *route.Router) {
	st.mu.Lock()
	if st.router == nil {
		st.router = rt
	}
	st.mu.Unlock()
}

// wholeLifeline is the lifeline object of a whole (not streamed)
// response: the end chunk's summary without the migration timeline, and
// the number of tokens.
type wholeLifeline struct {
	sse.Lifeline
	Tokens int
}

func (l wholeLifeline) MarshalJSON() ([]byte, error) {
	end := l.Lifeline
	end.LastMigration = nil
	b, err := json.Marshal(end)
	if err != nil {
		return nil, err
	}
	// b is an object with a request_id at least: the count goes before
	// its closing brace.
	return append(b[:len(b)-1], `,"tokens":`+strconv.Itoa(l.Tokens)+`}`...), nil
}
