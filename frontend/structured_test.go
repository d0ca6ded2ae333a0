package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

const chatA = `"model":"m","messages":[{"role":"user","content":"a"}]`

// TestParseOutputShape: response_format, logprobs, echo and tools — what
// each accepts, what it is refused with (param and code), and how they
// combine.
func TestParseOutputShape(t *testing.T) {
	schema := `{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}`
	tool := func(name, params string) string {
		return `{"type":"function","function":{"name":"` + name + `","parameters":` + params + `}}`
	}
	for _, tc := range []struct {
		name  string
		chat  bool
		body  string
		param string
		code  string
		check func(CompletionRequest) bool
	}{
		{name: "text", chat: true, body: `{` + chatA + `,"response_format":{"type":"text"}}`, check: func(b CompletionRequest) bool { return b.Structured == nil }},
		{name: "json_schema", chat: true, body: `{` + chatA + `,"max_tokens":64,"response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":` + schema + `}}}`,
			check: func(b CompletionRequest) bool {
				w := b.Structured.wire()
				return w.Kind == wire.Structured_JSON_SCHEMA && string(w.Schema) == schema && !w.Optional
			}},
		{name: "json_schema without schema", chat: true, body: `{` + chatA + `,"response_format":{"type":"json_schema","json_schema":{"name":"n"}}}`,
			check: func(b CompletionRequest) bool { return b.Structured.wire().Kind == wire.Structured_JSON_OBJECT }},
		{name: "format type", chat: true, body: `{` + chatA + `,"response_format":{"type":"yaml"}}`, param: "response_format", code: CodeInvalidValue},
		{name: "format shape", chat: true, body: `{` + chatA + `,"response_format":"json"}`, param: "response_format", code: CodeInvalidValue},
		{name: "json_schema missing", chat: true, body: `{` + chatA + `,"response_format":{"type":"json_schema"}}`, param: "response_format", code: CodeMissingRequired},
		{name: "json_schema bad name", chat: true, body: `{` + chatA + `,"response_format":{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}}`, param: "response_format", code: CodeInvalidValue},
		{name: "schema keyword", chat: true, body: `{` + chatA + `,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"string","pattern":"x"}}}}`,
			param: "response_format", code: CodeUnsupportedParameter},
		{name: "schema invalid", chat: true, body: `{` + chatA + `,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object","required":["zz"]}}}}`,
			param: "response_format", code: CodeInvalidValue},
		{name: "schema too long for max_tokens", chat: true, body: `{` + chatA + `,"max_tokens":3,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":` + schema + `}}}`,
			param: "max_tokens", code: CodeInvalidValue},
		{name: "json_object max_tokens 1", chat: true, body: `{` + chatA + `,"max_tokens":1,"response_format":{"type":"json_object"}}`, param: "max_tokens", code: CodeInvalidValue},
		{name: "structured with stop", chat: true, body: `{` + chatA + `,"stop":"}","response_format":{"type":"json_object"}}`, param: "stop", code: CodeUnsupportedParameter},
		{name: "structured with ignore_eos", chat: true, body: `{` + chatA + `,"ignore_eos":true,"response_format":{"type":"json_object"}}`, param: "ignore_eos", code: CodeUnsupportedParameter},
		{name: "chat logprobs", chat: true, body: `{` + chatA + `,"logprobs":true,"top_logprobs":20}`, check: func(b CompletionRequest) bool { return b.Logprobs && b.TopLogprobs == 20 }},
		{name: "chat top_logprobs 21", chat: true, body: `{` + chatA + `,"logprobs":true,"top_logprobs":21}`, param: "top_logprobs", code: CodeInvalidValue},
		{name: "chat logprobs number", chat: true, body: `{` + chatA + `,"logprobs":3}`, param: "logprobs", code: CodeInvalidValue},
		{name: "completions logprobs 0", body: `{"model":"m","prompt":"a","logprobs":0}`, check: func(b CompletionRequest) bool { return b.Logprobs && b.TopLogprobs == 0 }},
		{name: "completions logprobs 6", body: `{"model":"m","prompt":"a","logprobs":6}`, param: "logprobs", code: CodeInvalidValue},
		{name: "completions top_logprobs", body: `{"model":"m","prompt":"a","top_logprobs":2}`, param: "top_logprobs", code: CodeUnsupportedParameter},
		{name: "echo with logprobs", body: `{"model":"m","prompt":"a","echo":true,"logprobs":1}`, param: "echo", code: CodeUnsupportedParameter},
		{name: "chat echo", chat: true, body: `{` + chatA + `,"echo":true}`, param: "echo", code: CodeUnsupportedParameter},
		{name: "tool required", chat: true, body: `{` + chatA + `,"tools":[` + tool("get_x", schema) + `,` + tool("f2", `{"type":"object"}`) + `],"tool_choice":"required","parallel_tool_calls":false}`,
			check: func(b CompletionRequest) bool {
				var s map[string]any
				json.Unmarshal(b.Structured.Schema, &s)
				return !b.Structured.Optional && !b.ToolCalls.Parallel && s["maxProperties"] == float64(1) && s["minProperties"] == float64(1) &&
					strings.HasPrefix(b.Prompt, `tools: [{"name":"get_x"`)
			}},
		{name: "tool named", chat: true, body: `{` + chatA + `,"tools":[` + tool("get_x", schema) + `,` + tool("f2", `{"type":"object"}`) + `],"tool_choice":{"type":"function","function":{"name":"f2"}}}`,
			check: func(b CompletionRequest) bool {
				return string(b.Structured.Schema) == `{"properties":{"tool_calls":{"items":{"properties":{"f2":{"type":"object"}},"required":["f2"],"type":"object"},"minItems":1,"type":"array"}},"required":["tool_calls"],"type":"object"}` &&
					b.ToolCalls.Parallel
			}},
		{name: "tool auto", chat: true, body: `{` + chatA + `,"tools":[` + tool("f", `{"type":"object"}`) + `]}`, check: func(b CompletionRequest) bool { return b.Structured.Optional && b.ToolCalls.Optional }},
		{name: "tool none", chat: true, body: `{` + chatA + `,"tools":[` + tool("f", `{"type":"object"}`) + `],"tool_choice":"none"}`,
			check: func(b CompletionRequest) bool { return b.Structured == nil && b.ToolCalls == nil && len(b.Tools) == 1 }},
		{name: "tool bad name", chat: true, body: `{` + chatA + `,"tools":[` + tool("get x", `{"type":"object"}`) + `]}`, param: "tools[0].function.name", code: CodeInvalidValue},
		{name: "tool twice", chat: true, body: `{` + chatA + `,"tools":[` + tool("f", `{"type":"object"}`) + `,` + tool("f", `{"type":"object"}`) + `]}`, param: "tools[1].function.name", code: CodeInvalidValue},
		{name: "tool params not object", chat: true, body: `{` + chatA + `,"tools":[` + tool("f", `{"type":"string"}`) + `]}`, param: "tools[0].function.parameters", code: CodeInvalidValue},
		{name: "tool params keyword", chat: true, body: `{` + chatA + `,"tools":[` + tool("f", `{"type":"object","patternProperties":{}}`) + `]}`, param: "tools[0].function.parameters", code: CodeUnsupportedParameter},
		{name: "tool type", chat: true, body: `{` + chatA + `,"tools":[{"type":"code_interpreter"}]}`, param: "tools[0].type", code: CodeUnsupportedParameter},
		{name: "tool_choice unknown", chat: true, body: `{` + chatA + `,"tools":[` + tool("f", `{}`) + `],"tool_choice":{"type":"function","function":{"name":"g"}}}`, param: "tools[0].function.parameters", code: CodeInvalidValue},
		{name: "tool_choice names none", chat: true, body: `{` + chatA + `,"tools":[` + tool("f", `{"type":"object"}`) + `],"tool_choice":{"type":"function","function":{"name":"g"}}}`, param: "tool_choice", code: CodeInvalidValue},
		{name: "tools with response_format", chat: true, body: `{` + chatA + `,"tools":[` + tool("f", `{"type":"object"}`) + `],"response_format":{"type":"json_object"}}`, param: "response_format", code: CodeUnsupportedParameter},
		{name: "tools with stop", chat: true, body: `{` + chatA + `,"tools":[` + tool("f", `{"type":"object"}`) + `],"stop":"x"}`, param: "stop", code: CodeUnsupportedParameter},
		{name: "tools on completions", body: `{"model":"m","prompt":"a","tools":[` + tool("f", `{"type":"object"}`) + `]}`, param: "tools", code: CodeUnsupportedParameter},
		{name: "functions", chat: true, body: `{` + chatA + `,"functions":[{"name":"f"}]}`, param: "functions", code: CodeUnsupportedParameter},
		{name: "function_call", chat: true, body: `{` + chatA + `,"function_call":"auto"}`, param: "function_call", code: CodeUnsupportedParameter},
		{name: "tool loop history", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"x?"},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_x","arguments":"{\"x\":1}"}}]},` +
			`{"role":"tool","tool_call_id":"call_1","content":"42"}]}`,
			check: func(b CompletionRequest) bool {
				return b.Prompt == "user: x?\nassistant: {\"get_x\":{\"x\":1}}\ntool call_1: 42\nassistant:"
			}},
		{name: "tool message without id", chat: true, body: `{"model":"m","messages":[{"role":"tool","content":"42"}]}`, param: "messages[0].tool_call_id", code: CodeMissingRequired},
		{name: "history call arguments", chat: true, body: `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{"}}]}]}`,
			param: "messages[0].tool_calls[0]", code: CodeInvalidValue},
		{name: "user tool_calls", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a","tool_calls":[]}]}`, param: "messages[0].tool_calls", code: CodeUnsupportedParameter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := parseRequest([]byte(tc.body), tc.chat)
			if err == nil {
				err = b.validate()
			}
			if tc.param == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if tc.check != nil && !tc.check(b) {
					t.Fatalf("parsed %+v", b)
				}
				return
			}
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Param != tc.param || pe.Code != tc.code || pe.Message == "" {
				t.Fatalf("got %#v (%v), want param %q code %q", pe, err, tc.param, tc.code)
			}
		})
	}
}

// TestStructuredWorkerRefusal: a worker's INVALID_REQUEST about the grammar
// or its budget names the client's parameter.
func TestStructuredWorkerRefusal(t *testing.T) {
	body := &CompletionRequest{Structured: &StructuredOutput{Kind: StructuredJSONSchema}}
	pe := structuredParamError(body, workerParamError("decode: invalid request: structured: grammar: unsupported schema keyword \"x\""))
	if pe.Param != "response_format" {
		t.Fatalf("%+v", pe)
	}
	pe = structuredParamError(body, workerParamError("decode: invalid request: max_tokens: 3 cannot close the value (needs 7)"))
	if pe.Param != "max_tokens" || !strings.Contains(pe.Message, "defaults to 16") {
		t.Fatalf("%+v", pe)
	}
	body.ToolCalls = &ToolCalls{}
	if pe = structuredParamError(body, workerParamError("decode: invalid request: structured.schema: bad")); pe.Param != "tools" {
		t.Fatalf("%+v", pe)
	}
	// The worker names response_format whatever the grammar came from.
	if pe = structuredParamError(body, workerParamError("decode: invalid request: response_format: grammar: too many nodes")); pe.Param != "tools" {
		t.Fatalf("%+v", pe)
	}
	w := httptest.NewRecorder()
	writeRequestErrorFor(w, &reqfsm.RequestError{Type: openai.ErrInvalidRequest, Message: "decode: invalid request: structured: bad"}, body)
	if w.Code != 400 || !strings.Contains(w.Body.String(), `"param":"tools"`) {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
}

// TestToolCallConversion: generated JSON becomes OpenAI tool calls with
// ids that depend on the request id and the call's index only.
func TestToolCallConversion(t *testing.T) {
	calls, ok := parseCalls("chatcmpl-1", []byte(`{"get_x":{"x": 1}}`), false)
	if !ok || len(calls) != 1 || calls[0].Function.Name != "get_x" || calls[0].Function.Arguments != `{"x": 1}` ||
		calls[0].Type != "function" || calls[0].ID != callID("chatcmpl-1", 0) {
		t.Fatalf("%+v", calls)
	}
	calls, ok = parseCalls("chatcmpl-1", []byte(`{"tool_calls":[{"a":{}},{"b":{"y":"z"}}]}`), true)
	if !ok || len(calls) != 2 || calls[1].Function.Name != "b" || calls[1].ID != callID("chatcmpl-1", 1) || calls[0].ID == calls[1].ID {
		t.Fatalf("%+v", calls)
	}
	if callID("chatcmpl-1", 0) != callID("chatcmpl-1", 0) || callID("chatcmpl-1", 0) == callID("chatcmpl-2", 0) ||
		!strings.HasPrefix(callID("r", 0), "call_") || len(callID("r", 0)) != 5+24 {
		t.Fatal("call ids are not a pure function of (request, index)")
	}
	for _, bad := range []string{`{"a":{},"b":{}}`, `{"a":`, `hello`, `[]`} {
		if _, ok := parseCalls("r", []byte(bad), false); ok {
			t.Fatalf("%s read as a call", bad)
		}
	}
	if _, ok := outputCalls("r", &ToolCalls{Optional: true}, textToks("Hello", " {")); ok {
		t.Fatal("text read as a call")
	}
}

func textToks(texts ...string) []reqfsm.Token {
	out := make([]reqfsm.Token, len(texts))
	for i, s := range texts {
		out[i] = reqfsm.Token{SequenceNo: i + 1, ID: 300 + i, Text: s, Instance: "d0"}
	}
	return out
}

// finishedWith is a stream of body whose request completed with output.
func finishedWith(id string, body CompletionRequest, chat bool, output []reqfsm.Token, reason string) *stream {
	st := newStream(id, body, chat, false, func(error) {})
	r := reqfsm.NewRequest(id, []int{1}, 64, time.Time{}, reqfsm.DefaultPolicy, t0)
	r.Output, r.State, r.FinishReason = logOf(output), reqfsm.Completed, reason
	st.publish(r.Output.View())
	x := &run{r: r, body: body}
	st.finish(r, x.summary())
	return st
}

func events(t *testing.T, st *stream, from int) []sse.Event {
	t.Helper()
	w := httptest.NewRecorder()
	(&Server{}).follow(w, httptest.NewRequest("GET", "/", nil), st, from, false)
	rd := sse.NewReader(w.Body)
	var evs []sse.Event
	for {
		ev, err := rd.Next()
		if err == io.EOF {
			return evs
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
}

// TestToolCallStream: a call's tokens are held back and the call is sent
// once, whole, under the id of the token that closed it; a resume after
// that id does not send it again, one before it sends it whole; the end
// says tool_calls and lists the ids delivered.
func TestToolCallStream(t *testing.T) {
	body := CompletionRequest{Model: "m", ToolCalls: &ToolCalls{Parallel: true, Optional: true}}
	out := textToks(`{"tool_calls":[`, `{"a":{"s":"}]"`, `}},`, `{"b":`, `{}}`, `]}`)
	st := finishedWith("chatcmpl-9", body, true, out, "stop")
	evs := events(t, st, 0)
	if len(evs) != 3 {
		t.Fatalf("%d events: %+v", len(evs), evs)
	}
	c0, c1, end := evs[0].Chunk.Choices[0], evs[1].Chunk.Choices[0], evs[2].Chunk
	if evs[0].ID != "3" || c0.Delta.Role != "assistant" || len(c0.Delta.ToolCalls) != 1 || c0.Delta.ToolCalls[0].Function.Arguments != `{"s":"}]"}` ||
		*c0.Delta.ToolCalls[0].Index != 0 || c0.Delta.ToolCalls[0].ID != callID("chatcmpl-9", 0) {
		t.Fatalf("first call %+v", evs[0])
	}
	if evs[1].ID != "5" || c1.Delta.ToolCalls[0].Function.Name != "b" || *c1.Delta.ToolCalls[0].Index != 1 || c1.Delta.Role != "" {
		t.Fatalf("second call %+v", evs[1])
	}
	if end.Finish() != "tool_calls" || !reflect.DeepEqual(end.Lifeline.ToolCalls, []string{callID("chatcmpl-9", 0), callID("chatcmpl-9", 1)}) {
		t.Fatalf("end %+v", end)
	}
	if evs := events(t, st, 3); len(evs) != 2 || evs[0].Chunk.Choices[0].Delta.ToolCalls[0].Function.Name != "b" {
		t.Fatalf("resume after the first call: %+v", evs)
	}
	if evs := events(t, st, 4); len(evs) != 2 || evs[0].ID != "5" {
		t.Fatalf("resume inside the second call: %+v", evs)
	}

	// tool_choice auto, and the model answered with text: it streams.
	st = finishedWith("chatcmpl-10", body, true, textToks("Hi", " there"), "stop")
	evs = events(t, st, 0)
	if len(evs) != 3 || evs[0].Chunk.Content() != "Hi" || evs[2].Chunk.Finish() != "stop" || evs[2].Chunk.Lifeline.ToolCalls != nil {
		t.Fatalf("text answer %+v", evs)
	}

	// Whole: the message holds the calls, no content.
	st = finishedWith("chatcmpl-11", CompletionRequest{Model: "m", ToolCalls: &ToolCalls{}}, true, textToks(`{"f":`, `{"x":1}}`), "stop")
	var res struct {
		Choices []struct {
			Message struct {
				Content   *string
				ToolCalls []sse.ToolCall `json:"tool_calls"`
			}
			FinishReason string `json:"finish_reason"`
		}
	}
	whole(t, st, &res)
	m := res.Choices[0].Message
	if res.Choices[0].FinishReason != "tool_calls" || m.Content != nil || len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Arguments != `{"x":1}` ||
		m.ToolCalls[0].ID != callID("chatcmpl-11", 0) || m.ToolCalls[0].Index != nil {
		t.Fatalf("whole %+v", res)
	}
}

func whole(t *testing.T, st *stream, v any) {
	t.Helper()
	w := httptest.NewRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	(&Server{}).writeWhole(w, httptest.NewRequest("POST", "/", nil).WithContext(ctx), st)
	if err := json.Unmarshal(w.Body.Bytes(), v); err != nil {
		t.Fatalf("%v: %s", err, w.Body)
	}
}

// TestLogprobsRendering: the chat shape and the legacy shape, streamed
// (one token per chunk, offsets continuing after a resume) and whole; the
// token log keeps them, so a resume renders the same.
func TestLogprobsRendering(t *testing.T) {
	tok := tokenizer.NewBuiltin()
	ids, err := tok.Encode("hello world")
	if err != nil || len(ids) < 2 {
		t.Fatal(ids, err)
	}
	out := make([]reqfsm.Token, len(ids))
	for i, id := range ids {
		out[i] = reqfsm.Token{SequenceNo: i + 1, ID: id, Text: string(tok.Piece(0, id)),
			Logprobs: &reqfsm.TokenLogprobs{Logprob: -0.5 * float64(i+1), Top: []reqfsm.TopLogprob{{ID: id, Logprob: -0.5 * float64(i+1)}, {ID: ids[0], Logprob: -3}}}}
	}
	body := CompletionRequest{Model: "m", Logprobs: true, TopLogprobs: 2}
	st := finishedWith("chatcmpl-3", body, true, out, "length")
	evs := events(t, st, 0)
	for i, ev := range evs[:len(ids)] {
		lp := ev.Chunk.Choices[0].Logprobs
		piece := string(tok.Piece(0, ids[i]))
		if lp == nil || len(lp.Content) != 1 || lp.Content[0].Token != piece || lp.Content[0].Logprob != -0.5*float64(i+1) ||
			len(lp.Content[0].Bytes) != len(piece) || len(lp.Content[0].TopLogprobs) != 2 || lp.Content[0].TopLogprobs[1].Logprob != -3 {
			t.Fatalf("chunk %d: %+v", i, lp)
		}
	}
	var res struct {
		Choices []struct{ Logprobs sse.Logprobs }
	}
	whole(t, st, &res)
	if len(res.Choices[0].Logprobs.Content) != len(ids) {
		t.Fatalf("whole %+v", res)
	}

	st = finishedWith("cmpl-3", body, false, out, "length")
	resumed := events(t, st, 1)
	lp := resumed[0].Chunk.Choices[0].Logprobs
	if lp.TextOffset[0] != len(out[0].Text) || lp.Tokens[0] != out[1].Text || lp.TokenLogprobs[0] != -1 || lp.TopLogprobs[0][out[0].Text] != -3 {
		t.Fatalf("legacy resumed chunk %+v", lp)
	}
	var legacy struct {
		Choices []struct{ Logprobs sse.Logprobs }
	}
	whole(t, st, &legacy)
	if l := legacy.Choices[0].Logprobs; len(l.Tokens) != len(ids) || l.TextOffset[0] != 0 || l.TextOffset[1] != len(out[0].Text) {
		t.Fatalf("legacy whole %+v", l)
	}

	// The record keeps them: a done request replayed elsewhere renders the same.
	if got := recordLogprobs(logprobsRecord(out[1].Logprobs)); !reflect.DeepEqual(got, out[1].Logprobs) {
		t.Fatalf("record round trip %+v", got)
	}
}

// TestEcho: the prompt before the text, whole and in the first chunk.
func TestEcho(t *testing.T) {
	st := finishedWith("cmpl-4", CompletionRequest{Model: "m", Prompt: "Say:", Echo: true}, false, textToks(" a", " b"), "length")
	if evs := events(t, st, 0); evs[0].Chunk.Content() != "Say: a" || evs[1].Chunk.Content() != " b" {
		t.Fatalf("%+v", evs)
	}
	var res struct{ Choices []struct{ Text string } }
	whole(t, st, &res)
	if res.Choices[0].Text != "Say: a b" {
		t.Fatalf("%+v", res)
	}
	st = finishedWith("cmpl-5", CompletionRequest{Model: "m", Prompt: "Say:", Echo: true}, false, nil, "stop")
	if evs := events(t, st, 0); len(evs) != 1 || evs[0].Chunk.Content() != "Say:" {
		t.Fatalf("no output: %+v", evs)
	}
}

// TestGenerateCarriesOutputShape: the worker request names the grammar and
// the logprobs.
func TestGenerateCarriesOutputShape(t *testing.T) {
	body := CompletionRequest{Model: "m", Prompt: "p", Logprobs: true, TopLogprobs: 3,
		Structured: &StructuredOutput{Kind: StructuredJSONSchema, Schema: json.RawMessage(`{"type":"object"}`), Optional: true}}
	x := &run{r: reqfsm.NewRequest("r", []int{1}, 8, time.Time{}, reqfsm.DefaultPolicy, t0), body: body}
	g := x.generateRequest(1, nil)
	if !g.Logprobs || g.TopLogprobs != 3 || g.Structured.Kind != wire.Structured_JSON_SCHEMA || string(g.Structured.Schema) != `{"type":"object"}` || !g.Structured.Optional {
		t.Fatalf("%+v", g)
	}
	// The worker's pieces (its model's vocabulary: a GGUF model's, not
	// the frontend's built-in one) are what the client sees.
	f := &wire.Frame{Logprob: -1.5, Piece: []byte("ü"), TopLogprobs: []*wire.TopLogprob{{TokenId: 9, Logprob: -0.25, Piece: []byte(" 世")}}}
	lp := x.frameLogprobs(f)
	if lp.Logprob != -1.5 || string(lp.Piece) != "ü" || lp.Top[0].ID != 9 || lp.Top[0].Logprob != -0.25 || string(lp.Top[0].Piece) != " 世" {
		t.Fatalf("%+v", lp)
	}
	chat := chatLogprobs([]reqfsm.Token{{ID: 7, Logprobs: lp}})
	if c := chat.Content[0]; c.Token != "ü" || len(c.Bytes) != 2 || c.TopLogprobs[0].Token != " 世" {
		t.Fatalf("rendered %+v", c)
	}
	x.body.Logprobs = false
	if x.frameLogprobs(f) != nil {
		t.Fatal("logprobs not asked for, kept")
	}
}
