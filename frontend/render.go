package frontend

import (
	"strings"
	"unicode/utf8"

	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// This file renders what a request asked for beyond the text: the echoed
// prompt, log-probabilities and tool calls, in streamed chunks and in
// whole responses. Everything here is a function of the token log, so a
// resume or a takeover's replay renders the same.

// tokenChunk is the streamed chunk of token t; offset tracks the legacy
// logprobs' text offset (negative: not known yet).
func (st *stream) tokenChunk(t reqfsm.Token, offset *int) sse.Chunk {
	text := t.Text
	if st.body.Echo && t.SequenceNo == 1 {
		text = st.echoText() + text
	}
	c := st.chunk(text, nil, sse.Lifeline{RequestID: st.id, SequenceNo: t.SequenceNo, TokenID: t.ID, InstanceID: t.Instance})
	if st.body.Logprobs {
		if *offset < 0 {
			*offset = st.textOffset(t.SequenceNo - 1)
		}
		c.Choices[0].Logprobs = st.renderLogprobs([]reqfsm.Token{t}, *offset)
		*offset += utf8.RuneCountInString(t.Text)
	}
	return c
}

// endText is the end chunk's text: the echoed prompt of a request that
// produced no token (no token's chunk carried it), else "".
func (st *stream) endText(r *reqfsm.Request) string {
	if st.body.Echo && r.Output.Len() == 0 {
		return st.echoText()
	}
	return ""
}

// finishReason is r's finish reason as the client sees it: "tool_calls"
// when its output is calls.
func (st *stream) finishReason(r *reqfsm.Request) string {
	if st.body.ToolCalls != nil && r.FinishReason == "stop" {
		if _, ok := st.calls(r.Output.Tokens()); ok {
			return "tool_calls"
		}
	}
	return r.FinishReason
}

// calls reads output as tool calls; false if the request has no tools or
// the output is text.
func (st *stream) calls(output []reqfsm.Token) ([]sse.ToolCall, bool) {
	return outputCalls(st.id, st.body.ToolCalls, output)
}

// outputCalls are output's calls as a stream delivers them: those the
// callScanner saw close, in order, with their index. The stream, the
// whole response and the record (callIDs) all read them here, so they
// agree however the output ends. false: the request has no tools, its
// output is text, or no call closed (a call output cut short before its
// first call closed is delivered as its text). A fragment after the last
// complete call (an output cut by length or an error) is delivered in
// neither shape: the calls are, and finish_reason says the output was cut.
func outputCalls(requestID string, tc *ToolCalls, output []reqfsm.Token) ([]sse.ToolCall, bool) {
	if tc == nil {
		return nil, false
	}
	sc := newCallScanner(requestID, tc)
	var calls []sse.ToolCall
	for _, t := range output {
		calls = append(calls, sc.feed(t.Text)...)
	}
	return calls, len(calls) > 0
}

// callIDs are the ids of the calls in output, for the request's summary
// (and so its record).
func callIDs(requestID string, tc *ToolCalls, output []reqfsm.Token) []string {
	calls, _ := outputCalls(requestID, tc, output)
	var ids []string
	for _, c := range calls {
		ids = append(ids, c.ID)
	}
	return ids
}

// wholeChoice is the choice of a whole (not streamed) response.
func (st *stream) wholeChoice(r *reqfsm.Request) map[string]any {
	var text strings.Builder
	if st.body.Echo {
		text.WriteString(st.echoText())
	}
	output := r.Output.Tokens()
	for _, t := range output {
		text.WriteString(t.Text)
	}
	choice := map[string]any{"index": 0, "finish_reason": st.finishReason(r)}
	if lp := st.renderLogprobs(output, 0); lp != nil {
		choice["logprobs"] = lp
	}
	if !st.chat {
		choice["text"] = text.String()
		return choice
	}
	msg := map[string]any{"role": "assistant", "content": text.String()}
	if calls, ok := st.calls(output); ok {
		for i := range calls {
			calls[i].Index = nil // a streamed chunk's field
		}
		msg["content"] = nil
		msg["tool_calls"] = calls
	}
	choice["message"] = msg
	return choice
}
