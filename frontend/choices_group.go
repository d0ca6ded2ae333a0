package frontend

import (
	"context"
	"net/http"
	"reflect"
	"strconv"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// group is a request of several choices as this frontend serves it: the
// streams of its children in choice order. A group holds no state of its
// own: it is assembled from the children's streams (local ones, adopted
// or replayed from their records) wherever the request is followed.
type group struct {
	id       string
	children []*stream
}

// errSiblingFailed ends the other choices of a request one of whose
// choices failed for good: the response ends with that choice's error.
var errSiblingFailed = &clientCancel{"another choice of the request failed"}

// serveChoices answers a request of several choices: one child request
// per choice, multiplexed into one response under the parent's id and
// resume token.
func (s *Server) serveChoices(w http.ResponseWriter, req *http.Request, body CompletionRequest, chat bool) {
	g := s.startGroup(body, chat, resumable(body, req))
	w.Header().Set("Lifeline-Request-Id", g.id)
	w.Header().Set("Lifeline-Seed", strconv.FormatUint(body.Seed, 10))
	w.Header().Set("Lifeline-Resume-Token", s.keys.IssueFor(g.id, time.Now(), s.resumeWindow()))
	if !body.Stream {
		s.writeWholeGroup(w, req, g)
		return
	}
	if !g.awaitStarts(w, req, &body) {
		return
	}
	s.followGroup(w, req, g, make([]int, len(g.children)), true)
}

// awaitStarts holds the status line of a streamed group, as for one
// choice, until every choice has its first token (a refusal is a 4xx,
// never an error after a 200) and its record. false: it answered, with
// the refusal named by the client's parameter, or the client left.
func (g *group) awaitStarts(w http.ResponseWriter, req *http.Request, body *CompletionRequest) bool {
	for _, st := range g.children {
		rerr, ok := st.awaitStart(req.Context())
		switch {
		case !ok:
			g.clientGone()
			return false
		case rerr != nil:
			g.cancel(errSiblingFailed)
			writeRequestErrorFor(w, rerr, body)
			return false
		}
	}
	for _, st := range g.children {
		if st.rec == nil {
			continue
		}
		select {
		case <-st.rec.stored:
		case <-req.Context().Done():
			g.clientGone()
			return false
		}
	}
	return true
}

// startGroup admits the children of body and runs them.
func (s *Server) startGroup(body CompletionRequest, chat, resumable bool) *group {
	g := &group{id: groupID(s.newID(chat), body.choiceCount())}
	for i, c := range body.children(g.id) {
		g.children = append(g.children, s.startAs(childID(g.id, i), c, chat, resumable))
	}
	// Nobody may follow a resumable request: a choice that fails for
	// good still ends the others.
	s.goes.Go(func() { g.watchFailures(s.ctx) })
	return g
}

// watchFailures cancels every choice once one failed for good, until all
// are done.
func (g *group) watchFailures(ctx context.Context) {
	for {
		rs, waits := g.states()
		if _, failed := g.failure(rs); failed {
			g.cancel(errSiblingFailed)
			return
		}
		if len(waits) == 0 || !waitAny(ctx, waits) {
			return
		}
	}
}

// states is each choice's finished request (nil while it runs) and the
// signals of the running ones' next change.
func (g *group) states() ([]*reqfsm.Request, []chan struct{}) {
	rs := make([]*reqfsm.Request, len(g.children))
	var waits []chan struct{}
	for i, st := range g.children {
		done, r, changed := st.state()
		if done {
			rs[i] = r
		} else {
			waits = append(waits, changed)
		}
	}
	return rs, waits
}

// failure is the error that ends the response, of the choices done so
// far: a choice's own error first, rather than the cancel it caused in
// the others. failed reports one that ends every choice for good (not a
// stopping frontend or a takeover: those go on elsewhere).
func (g *group) failure(rs []*reqfsm.Request) (e *reqfsm.RequestError, failed bool) {
	for _, r := range rs {
		if r == nil || r.Err == nil {
			continue
		}
		if e == nil || e.Type == openai.ErrCancelledType && r.Err.Type != openai.ErrCancelledType {
			e = r.Err
		}
	}
	if e == nil {
		return nil, false
	}
	return e, e.Type != openai.ErrFrontendStopping && e.Type != openai.ErrTakenOver && e.Type != openai.ErrCancelledType
}

// cancel ends every choice with cause.
func (g *group) cancel(cause error) {
	for _, st := range g.children {
		st.cancel(cause)
	}
}

func (g *group) clientGone() {
	for _, st := range g.children {
		st.clientGone()
	}
}

// waitAny waits for one of chans to be closed: false when ctx ended first.
func waitAny(ctx context.Context, chans []chan struct{}) bool {
	cases := make([]reflect.SelectCase, 0, len(chans)+1)
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
	for _, c := range chans {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
	}
	i, _, _ := reflect.Select(cases)
	return i != 0
}

// usage is the response's usage: the prompt counted once per prompt (as
// OpenAI does, not once per choice), the completion tokens summed.
func (g *group) usage(rs []*reqfsm.Request) *sse.Usage {
	u := &sse.Usage{}
	for _, r := range rs {
		if r != nil {
			u.CompletionTokens += r.Output.Len()
		}
	}
	for _, i := range g.firstOfPrompts() {
		st := g.children[i]
		if r := rs[i]; r != nil {
			st.meta(serving(r)) // learns the prompt's length, if not yet
		}
		u.PromptTokens += st.usage(0).PromptTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// serving is the instance that served r last.
func serving(r *reqfsm.Request) string {
	if r.Output.Len() > 0 {
		return r.Output.LastInstance()
	}
	return r.Endpoint.InstanceID
}

// firstOfPrompts is the index of each prompt's first choice.
func (g *group) firstOfPrompts() []int {
	var out []int
	seen := map[int]bool{}
	for i, st := range g.children {
		p := 0
		if c := st.body.Choice; c != nil {
			p = c.Prompt
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, i)
		}
	}
	return out
}

// chunk is choice i's chunk as the parent streams it: the parent's id and
// admission, the choice's index.
func (g *group) chunk(i int, c sse.Chunk) sse.Chunk {
	c.ID, c.Created, c.Choices[0].Index = g.id, g.children[0].created, i
	c.Lifeline.RequestID = g.id
	return c
}

// followGroup writes the choices after positions pos, interleaved as their
// tokens arrive, then each one's finish chunk, then the end. When the
// client that made a request that did not ask to be resumable (owner)
// goes away, every choice is cancelled.
func (s *Server) followGroup(w http.ResponseWriter, req *http.Request, g *group, pos []int, owner bool) {
	unwatch := make([]func() bool, len(g.children))
	for i, st := range g.children {
		st.useRouter(s.router)
		unwatch[i] = st.watch()
	}
	w, unslow := s.slow.watch(w)
	gone := false
	defer func() {
		unslow()
		done := true
		for _, u := range unwatch {
			done = u() && done
		}
		if !done && !g.children[0].resumable && owner && (gone || req.Context().Err() != nil) {
			g.cancel(errClientGone)
		}
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
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
	gone = !g.writeFrom(req.Context(), sw, flusher, pos, newPulse(s.beat, sw, flusher))
}

// writeFrom writes every choice after its position as the logs grow, then
// the end; false when the client went away first. Each event's id holds
// every choice's position.
func (g *group) writeFrom(ctx context.Context, sw *sse.Writer, flusher http.Flusher, pos []int, p *pulse) bool {
	offsets := make([]int, len(g.children)) // logprobs' text offsets, learnt at the first token
	for i := range offsets {
		offsets[i] = -1
	}
	for {
		rs := make([]*reqfsm.Request, len(g.children))
		var waits []chan struct{}
		for i, st := range g.children {
			toks, done, r, changed := st.snapshot()
			for t := range toks.From(pos[i]) {
				pos[i] = t.SequenceNo
				c := g.chunk(i, st.tokenChunk(t, &offsets[i]))
				if sw.WriteChunkID(&c, sse.FormatPositions(pos)) != nil {
					return false
				}
				p.sent()
			}
			if !done {
				waits = append(waits, changed)
				continue
			}
			rs[i] = r
			if r.Err == nil && pos[i] <= r.Output.Len() {
				// One past the last token: this choice's finish is delivered.
				pos[i] = r.Output.Len() + 1
				finish := st.finishReason(r)
				c := g.chunk(i, st.chunk(st.endText(r), &finish, st.endSummary()))
				if sw.WriteChunkID(&c, sse.FormatPositions(pos)) != nil {
					return false
				}
			}
		}
		if flusher != nil {
			flusher.Flush()
		}
		if e, failed := g.failure(rs); e != nil {
			if failed {
				g.cancel(errSiblingFailed)
			}
			g.writeError(sw, flusher, e)
			return true
		}
		if len(waits) == 0 {
			g.writeEnd(sw, flusher, rs)
			return true
		}
		if !p.awaitAny(ctx, waits) {
			return false
		}
	}
}

// writeError ends the response with a choice's error: taken_over names
// the new owner and has no [DONE] (the stream goes on there).
func (g *group) writeError(sw *sse.Writer, flusher http.Flusher, e *reqfsm.RequestError) {
	ev := sse.Error{Message: e.Message, Type: string(e.Type)}
	if e.Type == openai.ErrTakenOver {
		for _, st := range g.children {
			if st.rec == nil {
				continue
			}
			st.rec.mu.Lock()
			if st.rec.movedTo != "" {
				ev.OwnerURL = st.rec.movedTo
			}
			st.rec.mu.Unlock()
		}
	}
	sw.WriteError(ev)
	if e.Type != openai.ErrTakenOver {
		sw.WriteDone()
	}
	if flusher != nil {
		flusher.Flush()
	}
}

// writeEnd ends a response whose choices all finished: the usage chunk
// if asked, then [DONE].
func (g *group) writeEnd(sw *sse.Writer, flusher http.Flusher, rs []*reqfsm.Request) {
	st := g.children[0]
	if st.body.StreamOptions.IncludeUsage {
		c := g.chunk(0, st.chunk("", nil, sse.Lifeline{}))
		c.Usage = g.usage(rs)
		sw.WriteUsage(&c)
	}
	sw.WriteDone()
	if flusher != nil {
		flusher.Flush()
	}
}

// writeWholeGroup answers a request of several choices that did not ask
// to be streamed: one response once every choice ended, its choices in
// index order, usage summed.
func (s *Server) writeWholeGroup(w http.ResponseWriter, req *http.Request, g *group) {
	for _, st := range g.children {
		st.useRouter(s.router)
		defer st.watch()()
	}
	for {
		rs, waits := g.states()
		if e, failed := g.failure(rs); failed || e != nil && len(waits) == 0 {
			g.cancel(errSiblingFailed)
			writeRequestErrorFor(w, e, &g.children[0].body) // the choices share their grammar
			return
		}
		if len(waits) == 0 {
			g.writeCompletion(w, rs)
			return
		}
		if !waitAny(req.Context(), waits) {
			g.clientGone()
			return
		}
	}
}

// writeCompletion writes the finished choices as one response.
func (g *group) writeCompletion(w http.ResponseWriter, rs []*reqfsm.Request) {
	first := g.children[0]
	choices := make([]map[string]any, len(rs))
	ll := make([]wholeLifeline, len(rs))
	tokens := 0
	at := ""
	for i, r := range rs {
		if i == 0 {
			at = serving(r)
		}
		tokens += r.Output.Len()
		st := g.children[i]
		choices[i] = st.wholeChoice(r)
		choices[i]["index"] = i
		ll[i] = wholeLifeline{Lifeline: st.endSummary(), Tokens: r.Output.Len()}
	}
	out := map[string]any{"id": g.id, "object": "text_completion", "created": first.created, "model": first.body.Model,
		"system_fingerprint": first.meta(at), "usage": g.usage(rs), "choices": choices,
		"lifeline": map[string]any{"request_id": g.id, "tokens": tokens, "choices": ll}}
	if first.chat {
		out["object"] = "chat.completion"
	}
	writeJSON(w, http.StatusOK, out)
}
