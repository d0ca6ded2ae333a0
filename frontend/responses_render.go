package frontend

import (
	"strconv"
	"strings"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// A response's events are a function of its token log: a renderer fed
// the log's tokens in order, then the request's end, makes the same
// events with the same sequence numbers at any frontend, from a live run,
// a takeover or a record's replay. A client that resumes after sequence
// number N is served the events the renderer makes after N: no gap, no
// duplicate. The response object (GET, the created and completed events)
// is the renderer's state.

// responseRender makes a response's events from its tokens.
type responseRender struct {
	st *stream
	// emit is given each event (nil: events are only counted, for the
	// object); false stops the rendering (the client went away).
	emit func(openai.Event) bool
	seq  int
	sc   *callScanner // nil: no tools
	held []reqfsm.Token
	// items is the output so far; msg is the index of the open message
	// (-1: none), text its text.
	items []openai.OutputItem
	msg   int
	text  strings.Builder
	calls int
	n     int // tokens fed
	ok    bool
}

func newResponseRender(st *stream, emit func(openai.Event) bool) *responseRender {
	rr := &responseRender{st: st, emit: emit, msg: -1, ok: true}
	if st.body.ToolCalls != nil {
		rr.sc = newCallScanner(st.id, st.body.ToolCalls)
	}
	return rr
}

func (rr *responseRender) out(ev openai.Event) {
	ev.SequenceNumber = rr.seq
	rr.seq++
	if rr.ok && rr.emit != nil {
		rr.ok = rr.emit(ev)
	}
}

func intp(i int) *int { return &i }

func strp(s string) *string { return &s }

// start makes the events that open the response.
func (rr *responseRender) start() {
	obj := rr.object(nil)
	rr.out(openai.Event{Type: openai.EventCreated, Response: &obj})
	rr.out(openai.Event{Type: openai.EventInProgress, Response: &obj})
}

// feed adds token t.
func (rr *responseRender) feed(t reqfsm.Token) {
	rr.n++
	if rr.sc == nil {
		rr.delta(t.Text)
		return
	}
	calls := rr.sc.feed(t.Text)
	switch rr.sc.mode {
	case scanUndecided:
		rr.held = append(rr.held, t)
	case scanText:
		for _, h := range rr.held {
			rr.delta(h.Text)
		}
		rr.held = nil
		rr.delta(t.Text)
	default:
		// A call's tokens are held until it closes: an output cut before
		// any call closed is delivered as its text (finish).
		rr.held = append(rr.held, t)
		if len(calls) > 0 {
			rr.held = nil
		}
		for _, c := range calls {
			rr.call(c)
		}
	}
}

// delta adds text to the message, opening it first.
func (rr *responseRender) delta(text string) {
	if rr.msg < 0 {
		rr.msg = len(rr.items)
		item := openai.OutputItem{ID: "msg_" + rr.suffix(), Type: openai.ItemMessage, Status: openai.StatusInProgress, Role: "assistant"}
		rr.items = append(rr.items, item)
		rr.out(openai.Event{Type: openai.EventOutputItemAdded, OutputIndex: intp(rr.msg), Item: &item})
		rr.out(openai.Event{Type: openai.EventContentPartAdded, ItemID: item.ID, OutputIndex: intp(rr.msg), ContentIndex: intp(0),
			Part: &openai.ContentPart{Type: openai.PartOutputText}})
	}
	if text == "" {
		return
	}
	rr.text.WriteString(text)
	rr.out(openai.Event{Type: openai.EventOutputTextDelta, ItemID: rr.items[rr.msg].ID, OutputIndex: intp(rr.msg), ContentIndex: intp(0),
		Delta: strp(text), Logprobs: &[]any{}})
}

// suffix is the response id's random part, for its items' ids.
func (rr *responseRender) suffix() string { return strings.TrimPrefix(rr.st.id, "resp_") }

// call adds a complete function call as an item of its own.
func (rr *responseRender) call(c sse.ToolCall) {
	i := len(rr.items)
	item := openai.OutputItem{ID: "fc_" + rr.suffix() + "_" + strconv.Itoa(rr.calls), Type: openai.ItemFunctionCall, Status: openai.StatusInProgress,
		CallID: c.ID, Name: c.Function.Name}
	rr.calls++
	rr.items = append(rr.items, item)
	rr.out(openai.Event{Type: openai.EventOutputItemAdded, OutputIndex: intp(i), Item: &item})
	rr.out(openai.Event{Type: openai.EventArgumentsDelta, ItemID: item.ID, OutputIndex: intp(i), Delta: strp(c.Function.Arguments)})
	rr.out(openai.Event{Type: openai.EventArgumentsDone, ItemID: item.ID, OutputIndex: intp(i), Arguments: strp(c.Function.Arguments), Name: c.Function.Name})
	item.Arguments, item.Status = c.Function.Arguments, openai.StatusCompleted
	rr.items[i] = item
	rr.out(openai.Event{Type: openai.EventOutputItemDone, OutputIndex: intp(i), Item: &item})
}

// finish makes the events that end the response, r ended as it did. A
// request that goes on elsewhere (taken over, its frontend stopping) has
// no end here: false.
func (rr *responseRender) finish(r *reqfsm.Request) bool {
	if r.Err != nil && (r.Err.Type == openai.ErrTakenOver || r.Err.Type == openai.ErrFrontendStopping) {
		return false
	}
	if r.Err == nil && rr.calls == 0 {
		// A call output cut short before a call closed is its text (as in
		// Chat Completions); no output at all is an empty message.
		for _, h := range rr.held {
			rr.delta(h.Text)
		}
		rr.held = nil
		if len(rr.items) == 0 {
			rr.delta("")
		}
	}
	if rr.msg >= 0 {
		rr.closeMessage(r)
	}
	obj := rr.object(r)
	typ := openai.EventCompleted
	switch obj.Status {
	case openai.StatusIncomplete:
		typ = openai.EventIncomplete
	case openai.StatusFailed, openai.StatusCancelled:
		typ = openai.EventFailed
	}
	rr.out(openai.Event{Type: typ, Response: &obj})
	return true
}

func (rr *responseRender) closeMessage(r *reqfsm.Request) {
	item := rr.items[rr.msg]
	text := rr.text.String()
	part := openai.ContentPart{Type: openai.PartOutputText, Text: text}
	rr.out(openai.Event{Type: openai.EventOutputTextDone, ItemID: item.ID, OutputIndex: intp(rr.msg), ContentIndex: intp(0), Text: strp(text), Logprobs: &[]any{}})
	rr.out(openai.Event{Type: openai.EventContentPartDone, ItemID: item.ID, OutputIndex: intp(rr.msg), ContentIndex: intp(0), Part: &part})
	item.Content, item.Status = []openai.ContentPart{part}, openai.StatusCompleted
	if r.Err != nil || r.FinishReason == "length" {
		item.Status = openai.StatusIncomplete
	}
	rr.items[rr.msg] = item
	rr.out(openai.Event{Type: openai.EventOutputItemDone, OutputIndex: intp(rr.msg), Item: &item})
	rr.msg = -1
}

// object is the response as rendered so far; r is the ended request (nil:
// in progress).
func (rr *responseRender) object(r *reqfsm.Request) openai.Response {
	st, meta := rr.st, rr.st.body.Response
	obj := openai.Response{ID: st.id, Object: openai.ResponseObject, CreatedAt: meta.CreatedAt, Status: openai.StatusInProgress,
		Background: meta.Background, Instructions: meta.Instructions, Metadata: meta.Metadata, Model: st.body.Model,
		Output: []openai.OutputItem{}, ParallelToolCalls: meta.Parallel, Store: meta.Store, Temperature: st.body.Temperature,
		TopP: st.body.TopP, Text: meta.Text, ToolChoice: meta.ToolChoice, Tools: meta.Tools, Truncation: "disabled", Seed: st.body.Seed}
	if obj.Metadata == nil {
		obj.Metadata = map[string]string{}
	}
	if st.body.MaxTokens != nil {
		obj.MaxOutputTokens = st.body.MaxTokens
	}
	if meta.Previous != "" {
		obj.PreviousResponseID = &meta.Previous
	}
	for _, it := range rr.items {
		if it.Type == openai.ItemMessage && it.Status == openai.StatusInProgress {
			it.Content = []openai.ContentPart{{Type: openai.PartOutputText, Text: rr.text.String()}}
		}
		obj.Output = append(obj.Output, it)
	}
	if r == nil {
		return obj
	}
	u := st.usage(r.Output.Len())
	obj.Usage = openai.NewUsage(u.PromptTokens, u.CompletionTokens)
	switch {
	case r.Err != nil && r.Err.Type == openai.ErrCancelledType:
		obj.Status = openai.StatusCancelled
		obj.Error = &openai.ResponseError{Code: string(r.Err.Type), Message: r.Err.Message}
	case r.Err != nil:
		obj.Status = openai.StatusFailed
		obj.Error = &openai.ResponseError{Code: string(r.Err.Type), Message: r.Err.Message}
	case r.FinishReason == "length":
		obj.Status = openai.StatusIncomplete
		obj.IncompleteDetails = &openai.IncompleteDetails{Reason: "max_output_tokens"}
	default:
		obj.Status = openai.StatusCompleted
	}
	return obj
}

// responseObject is st's response now: its output so far, and its end
// once done.
func (st *stream) responseObject() openai.Response {
	toks, done, r, _ := st.snapshot()
	rr := newResponseRender(st, nil)
	for t := range toks.From(0) {
		rr.feed(t)
	}
	if !done {
		return rr.object(nil)
	}
	if !rr.finish(r) {
		return rr.object(nil) // going on at another frontend
	}
	return rr.object(r)
}
