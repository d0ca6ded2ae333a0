package frontend

import (
	"strings"
	"unicode/utf8"

	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// This file renders what a request asked for beyond the text: the echoed
// prompt, log-probabilities and tool calls, in streamed chunks and in
// whole responses. Everything here is a function of the token log, so a
// resume or a takeover's replay renders the same.

// tokenChunk is the streamed chunk of token t; offset tracks the legacy
// logprobs' text offset (negative: not known yet).
func (st *stream) tokenChunk(t Token, offset *int) sse.Chunk {
	text := t.Text
	if st.body.Echo && t.SequenceNo == 1 {
		text = st.echoText() + text
	}
	c := st.chunk(text, nil, sse.Lifeline{RequestID: st.id, SequenceNo: t.SequenceNo, TokenID: t.ID, InstanceID: t.instance})
	if st.body.Logprobs {
		if *offset < 0 {
			*offset = st.textOffset(t.SequenceNo - 1)
		}
		c.Choices[0].Logprobs = st.renderLogprobs([]Token{t}, *offset)
		*offset += utf8.RuneCountInString(t.Text)
	}
	return c
}

// endText is the end chunk's text: the echoed prompt of a request that
// produced no token (no token's chunk carried it), else "".
func (st *stream) endText(r *Request) string {
	if st.body.Echo && len(r.Output) == 0 {
		return st.echoText()
	}
	return ""
}

// finishReason is r's finish reason as the client sees it: "tool_calls"
// when its output is calls.
func (st *stream) finishReason(r *Request) string {
	if st.body.ToolCalls != nil && r.FinishReason == "stop" {
		if _, ok := st.calls(r.Output); ok {
			return "tool_calls"
		}
	}
	return r.FinishReason
}

// calls reads output as tool calls; false if the request has no tools or
// the output is text.
func (st *stream) calls(output []Token) ([]sse.ToolCall, bool) {
	return outputCalls(st.id, st.body.ToolCalls, output)
}

func outputCalls(requestID string, tc *ToolCalls, output []Token) ([]sse.ToolCall, bool) {
	if tc == nil {
		return nil, false
	}
	var text strings.Builder
	for _, t := range output {
		text.WriteString(t.Text)
	}
	s := text.String()
	if tc.Optional && !strings.HasPrefix(s, "{") {
		return nil, false
	}
	return parseCalls(requestID, []byte(s), tc.Parallel)
}

// callIDs are the ids of the calls in output, for the request's summary
// (and so its record).
func callIDs(requestID string, tc *ToolCalls, output []Token) []string {
	calls, _ := outputCalls(requestID, tc, output)
	var ids []string
	for _, c := range calls {
		ids = append(ids, c.ID)
	}
	return ids
}

// wholeChoice is the choice of a whole (not streamed) response.
func (st *stream) wholeChoice(r *Request) map[string]any {
	var text strings.Builder
	if st.body.Echo {
		text.WriteString(st.echoText())
	}
	for _, t := range r.Output {
		text.WriteString(t.Text)
	}
	choice := map[string]any{"index": 0, "finish_reason": st.finishReason(r)}
	if lp := st.renderLogprobs(r.Output, 0); lp != nil {
		choice["logprobs"] = lp
	}
	if !st.chat {
		choice["text"] = text.String()
		return choice
	}
	msg := map[string]any{"role": "assistant", "content": text.String()}
	if calls, ok := st.calls(r.Output); ok {
		msg["content"] = nil
		msg["tool_calls"] = calls
	}
	choice["message"] = msg
	return choice
}
