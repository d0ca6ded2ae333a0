package frontend

import (
	"context"
	"net/http"

	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// This file streams a request with tools. A call's tokens are held back
// and the call is sent once, complete, in one chunk whose event id is the
// sequence number of the token that closed it: a client that resumes
// after that id has the call, one that resumes before gets it whole, so
// no call is seen twice or in pieces. Output that is text (tool_choice
// auto, not starting with '{') streams as usual.

// callScanner finds where the calls of a call output close, byte by byte:
// it follows the JSON nesting outside strings.
type callScanner struct {
	requestID string
	tc        *ToolCalls
	// mode: 0 undecided (no byte yet), 1 calls, 2 text.
	mode     int
	buf      []byte
	depth    int
	inString bool
	escaped  bool
	start    int // where the current call began in buf
	next     int // index of the next call
}

const (
	scanUndecided = iota
	scanCalls
	scanText
)

func newCallScanner(requestID string, tc *ToolCalls) *callScanner {
	return &callScanner{requestID: requestID, tc: tc}
}

// callDepth is the nesting at which a call's object sits.
func (s *callScanner) callDepth() int {
	if s.tc.Parallel {
		return 3 // {"tool_calls": [ {call} ]}
	}
	return 1
}

// feed adds a token's text and returns the calls it completed.
func (s *callScanner) feed(text string) []sse.ToolCall {
	var done []sse.ToolCall
	for i := 0; i < len(text); i++ {
		c := text[i]
		if s.mode == scanUndecided {
			s.mode = scanCalls
			if s.tc.Optional && c != '{' {
				s.mode = scanText
			}
		}
		if s.mode == scanText {
			return nil
		}
		s.buf = append(s.buf, c)
		switch {
		case s.inString:
			switch {
			case s.escaped:
				s.escaped = false
			case c == '\\':
				s.escaped = true
			case c == '"':
				s.inString = false
			}
		case c == '"':
			s.inString = true
		case c == '{' || c == '[':
			s.depth++
			if s.depth == s.callDepth() {
				s.start = len(s.buf) - 1
			}
		case c == '}' || c == ']':
			if s.depth == s.callDepth() {
				if call, ok := oneCall(s.requestID, s.next, s.buf[s.start:]); ok {
					idx := s.next
					call.Index = &idx
					done = append(done, call)
					s.next++
				}
			}
			s.depth--
		}
	}
	return done
}

// writeCallsFrom is writeFrom for a request with tools.
func (st *stream) writeCallsFrom(ctx context.Context, sw *sse.Writer, flusher http.Flusher, from int, p *pulse) bool {
	sc := newCallScanner(st.id, st.body.ToolCalls)
	var held []reqfsm.Token // tokens not sent yet (their call is not complete)
	offset := -1
	fed := 0
	for {
		toks, done, r, changed := st.snapshot()
		wrote := false
		for t := range toks.From(fed) {
			fed = t.SequenceNo
			calls := sc.feed(t.Text)
			held = append(held, t)
			if sc.mode == scanUndecided {
				continue
			}
			if sc.mode == scanText {
				for _, h := range held {
					if h.SequenceNo > from {
						c := st.tokenChunk(h, &offset)
						if sw.WriteChunk(&c) != nil {
							return false
						}
						wrote = true
					}
				}
				held = nil
				continue
			}
			if len(calls) == 0 {
				continue
			}
			if t.SequenceNo > from {
				c := st.callChunk(t, calls, held)
				if sw.WriteChunk(&c) != nil {
					return false
				}
				wrote = true
			}
			held = nil
		}
		if wrote {
			if flusher != nil {
				flusher.Flush()
			}
			p.sent()
		}
		if done {
			st.writeHeld(sw, r, held, from, sc.next > 0)
			st.writeEnd(sw, flusher, r)
			return true
		}
		if !p.await(ctx, changed) {
			return false
		}
	}
}

// callChunk is the chunk of calls, which token t completed; held are the
// tokens since the last chunk (their logprobs go with it).
func (st *stream) callChunk(t reqfsm.Token, calls []sse.ToolCall, held []reqfsm.Token) sse.Chunk {
	c := st.chunk("", nil, sse.Lifeline{RequestID: st.id, SequenceNo: t.SequenceNo, TokenID: t.ID, InstanceID: t.Instance})
	c.Choices[0].Delta = &sse.Delta{ToolCalls: calls}
	if *calls[0].Index == 0 {
		c.Choices[0].Delta.Role = "assistant"
	}
	c.Choices[0].Logprobs = st.renderLogprobs(held, 0)
	return c
}

// writeHeld writes, at the end, tokens still held back: a call output the
// worker cut short before any call closed is not a call, the client gets
// its text (as in a whole response). After a call was sent, the tokens
// after the last call's close (its brackets, or a call cut short) are not
// sent: the calls are the output (outputCalls).
func (st *stream) writeHeld(sw *sse.Writer, r *reqfsm.Request, held []reqfsm.Token, from int, callsSent bool) {
	if callsSent || r.Err != nil {
		return
	}
	offset := -1
	for _, h := range held {
		if h.SequenceNo <= from {
			continue
		}
		c := st.tokenChunk(h, &offset)
		if sw.WriteChunk(&c) != nil {
			return
		}
	}
}
