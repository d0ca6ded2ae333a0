package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// personSchema is a schema of the grammar's subset: objects, strings,
// integers, booleans, enums, arrays and required.
const personSchema = `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"ok":{"type":"boolean"},` +
	`"tags":{"type":"array","items":{"type":"string","enum":["a","b"]},"maxItems":3}},"required":["name","age","ok"]}`

// weatherTool's parameters are an object schema with one required string.
var weatherTool = []any{map[string]any{"type": "function", "function": map[string]any{"name": "get_weather",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}}}}}

// TestOpenAISDKStructured drives a real cluster with the official SDK for
// the request kinds a plain token prefix did not resume before: structured
// output (json_object, json_schema), logprobs, and tool calls — whole and
// streamed; then a decode worker SIGKILLed mid-stream for each, with the
// output (logprobs and tool call ids included) identical to a fault-free
// run of the same seed, and the json_schema output still valid.
func TestOpenAISDKStructured(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	url := clustertest.StartFrontend(t, n)
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()
	chat := func(prompt string, maxTokens int64) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: "tiny", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
			MaxCompletionTokens: openai.Int(maxTokens), Seed: openai.Int(5), Temperature: openai.Float(0.9)}
	}
	jsonSchema := option.WithJSONSet("response_format", map[string]any{"type": "json_schema",
		"json_schema": map[string]any{"name": "person", "strict": true, "schema": json.RawMessage(personSchema)}})

	t.Run("json_object", func(t *testing.T) {
		opt := option.WithJSONSet("response_format", map[string]any{"type": "json_object"})
		got, err := c.Chat.Completions.New(ctx, chat("A JSON object please", 48), opt)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(got.Choices[0].Message.Content), &v); err != nil {
			t.Fatalf("not a JSON object: %q: %v", got.Choices[0].Message.Content, err)
		}
		if s := runChat(t, c, chat("A JSON object please", 48), nil, opt); s.text != got.Choices[0].Message.Content {
			t.Fatalf("streamed %q, whole %q", s.text, got.Choices[0].Message.Content)
		}
	})

	t.Run("json_schema", func(t *testing.T) {
		got, err := c.Chat.Completions.New(ctx, chat("Describe a person", 96), jsonSchema)
		if err != nil {
			t.Fatal(err)
		}
		validates(t, personSchema, got.Choices[0].Message.Content)
		if s := runChat(t, c, chat("Describe a person", 96), nil, jsonSchema); s.text != got.Choices[0].Message.Content {
			t.Fatalf("streamed %q, whole %q", s.text, got.Choices[0].Message.Content)
		}
		// A schema outside the subset, and a budget too small to close
		// the value: 400s naming the parameter, before any stream.
		bad := option.WithJSONSet("response_format", map[string]any{"type": "json_schema",
			"json_schema": map[string]any{"name": "p", "schema": map[string]any{"type": "string", "pattern": "x+"}}})
		st := c.Chat.Completions.NewStreaming(ctx, chat("x", 8), bad)
		for st.Next() {
		}
		wantAPIError(t, st.Err(), 400, "response_format", "")
		st = c.Chat.Completions.NewStreaming(ctx, chat("x", 3), jsonSchema)
		for st.Next() {
		}
		wantAPIError(t, st.Err(), 400, "max_tokens", "")
	})

	t.Run("logprobs", func(t *testing.T) {
		p := chat("Once upon a time", 12)
		p.Logprobs, p.TopLogprobs = openai.Bool(true), openai.Int(3)
		got, err := c.Chat.Completions.New(ctx, p, eosOpt)
		if err != nil {
			t.Fatal(err)
		}
		lps := got.Choices[0].Logprobs.Content
		if len(lps) != 12 {
			t.Fatalf("%d logprobs for 12 tokens: %s", len(lps), got.RawJSON())
		}
		for _, lp := range lps {
			if lp.Logprob > 0 || len(lp.TopLogprobs) != 3 || lp.TopLogprobs[0].Logprob < lp.TopLogprobs[2].Logprob || lp.Logprob < lp.TopLogprobs[2].Logprob && lp.Token == lp.TopLogprobs[0].Token {
				t.Fatalf("logprob %s", lp.RawJSON())
			}
		}
		s := runChat(t, c, p, nil, eosOpt)
		whole, _ := json.Marshal(lps)
		streamed, _ := json.Marshal(s.logprobs)
		if s.text != got.Choices[0].Message.Content || string(whole) != string(streamed) {
			t.Fatalf("streamed logprobs differ:\n%s\n%s", streamed, whole)
		}
		// The completions' legacy shape.
		cp := openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(6), Seed: openai.Int(5), Logprobs: openai.Int(2)}
		legacy, err := c.Completions.New(ctx, cp, eosOpt)
		if err != nil {
			t.Fatal(err)
		}
		l := legacy.Choices[0].Logprobs
		if len(l.Tokens) != 6 || len(l.TokenLogprobs) != 6 || len(l.TopLogprobs) != 6 || len(l.TextOffset) != 6 || l.TextOffset[0] != 0 {
			t.Fatalf("legacy logprobs %s", legacy.RawJSON())
		}
		// echo with logprobs would need the prompt's: refused, naming echo.
		cp.Echo = openai.Bool(true)
		_, err = c.Completions.New(ctx, cp)
		wantAPIError(t, err, 400, "echo", "")
	})

	t.Run("tool call", func(t *testing.T) {
		tools := option.WithJSONSet("tools", weatherTool)
		opts := []option.RequestOption{tools, option.WithJSONSet("tool_choice", "required"), option.WithJSONSet("parallel_tool_calls", false)}
		got, err := c.Chat.Completions.New(ctx, chat("What is the weather in Paris?", 64), opts...)
		if err != nil {
			t.Fatal(err)
		}
		calls := got.Choices[0].Message.ToolCalls
		if got.Choices[0].FinishReason != "tool_calls" || len(calls) != 1 || calls[0].Function.Name != "get_weather" || calls[0].ID != wantCallID(got.ID, 0) {
			t.Fatalf("tool call %s", got.RawJSON())
		}
		var args struct{ City *string }
		if err := json.Unmarshal([]byte(calls[0].Function.Arguments), &args); err != nil || args.City == nil {
			t.Fatalf("arguments %q: %v", calls[0].Function.Arguments, err)
		}
		s := runChat(t, c, chat("What is the weather in Paris?", 64), nil, opts...)
		if len(s.calls) != 1 || s.calls[0].name != "get_weather" || s.calls[0].args != calls[0].Function.Arguments || s.finish != "tool_calls" ||
			s.calls[0].id != wantCallID(s.id, 0) || strings.Join(s.endCalls, ",") != s.calls[0].id {
			t.Fatalf("streamed calls %+v (end %v), whole %s", s.calls, s.endCalls, got.RawJSON())
		}
		// The tool loop: the call and its result in the history.
		loop := chat("What is the weather in Paris?", 8)
		loop.Messages = append(loop.Messages, got.Choices[0].Message.ToParam(), openai.ToolMessage("18C and sunny", calls[0].ID))
		if _, err := c.Chat.Completions.New(ctx, loop, tools, option.WithJSONSet("tool_choice", "none")); err != nil {
			t.Fatalf("tool loop: %v", err)
		}
	})

	// kill SIGKILLs the decode worker serving a stream once it has sent
	// its token at sequence number at.
	kill := func(at int) (func(seq int, instance string), *string) {
		killed := new(string)
		return func(seq int, instance string) {
			if seq >= at && *killed == "" {
				*killed = instance
				killWorker(t, n, instance)
			}
		}, killed
	}

	t.Run("worker killed: logprobs", func(t *testing.T) {
		p := chat("Tell me a story", 80)
		p.Logprobs, p.TopLogprobs = openai.Bool(true), openai.Int(5)
		want := runChat(t, c, p, nil, eosOpt)
		each, killed := kill(20)
		got := runChat(t, c, p, each, eosOpt)
		if *killed == "" || !got.instances[*killed] || len(got.instances) < 2 {
			t.Fatalf("killed %q, instances %v", *killed, got.instances)
		}
		w, _ := json.Marshal(want.logprobs)
		g, _ := json.Marshal(got.logprobs)
		if got.text != want.text || string(w) != string(g) {
			t.Fatalf("after the kill:\n%q\n%s\nwant\n%q\n%s", got.text, g, want.text, w)
		}
	})

	t.Run("worker killed: json_schema", func(t *testing.T) {
		p := chat("Describe a person", 120)
		want := runChat(t, c, p, nil, jsonSchema)
		validates(t, personSchema, want.text)
		each, killed := kill(len(want.tokens) / 2)
		got := runChat(t, c, p, each, jsonSchema)
		if *killed == "" || !got.instances[*killed] || len(got.instances) < 2 || got.text != want.text {
			t.Fatalf("killed %q, instances %v: %q, want %q", *killed, got.instances, got.text, want.text)
		}
		validates(t, personSchema, got.text)
	})

	t.Run("worker killed: tool call", func(t *testing.T) {
		// A call is held back until complete, so no chunk says which worker
		// serves it: both are killed once its first token exists (the
		// response's headers come then), and the agent restarts them; the
		// request waits for one, replays the grammar over its prefix and
		// continues.
		p := chat("What is the weather in a very long city name?", 96)
		opts := []option.RequestOption{option.WithJSONSet("tools", weatherTool), option.WithJSONSet("tool_choice", "required"),
			option.WithJSONSet("parallel_tool_calls", false)}
		want := runChat(t, c, p, nil, opts...)
		killedAll := false
		mw := option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			resp, err := next(r)
			if err == nil && !killedAll {
				killedAll = true
				for _, w := range n.NodectlWorkers(t) {
					syscall.Kill(w.PID, syscall.SIGKILL)
				}
			}
			return resp, err
		})
		got := runChat(t, c, p, nil, append(opts, mw)...)
		if !killedAll || got.migrations < 1 || len(got.calls) != 1 || got.calls[0].name != want.calls[0].name || got.calls[0].args != want.calls[0].args ||
			got.calls[0].id != wantCallID(got.id, 0) || strings.Join(got.endCalls, ",") != got.calls[0].id {
			t.Fatalf("after the kill: %+v (migrations %d), want %+v", got.calls, got.migrations, want.calls)
		}
	})
}

var eosOpt = option.WithJSONSet("ignore_eos", true)

// wantCallID is the id the frontend gives call seq of request id: a pure
// function of both (so a migration or takeover cannot change it).
func wantCallID(id string, seq int) string {
	h := sha256.Sum256([]byte(id + "\x00tool_call\x00" + strconv.Itoa(seq)))
	return "call_" + hex.EncodeToString(h[:12])
}

// validates checks text against schema with the engine's own automaton:
// every byte accepted and the value complete.
func validates(t *testing.T, schema, text string) {
	t.Helper()
	a, err := grammar.Compile([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	s, ok := a.Advance(a.Start(), []byte(text))
	if !ok || !a.Accepting(s) || !json.Valid([]byte(text)) {
		t.Fatalf("%q does not validate against %s", text, schema)
	}
}

type streamedCall struct{ id, name, args string }

// chatOutput is what a chat stream delivered.
type chatOutput struct {
	id, text, finish string
	tokens           []int
	logprobs         []openai.ChatCompletionTokenLogprob
	calls            []streamedCall
	endCalls         []string
	instances        map[string]bool
	migrations       int
}

// runChat streams a chat completion through the SDK, calling each with
// every token chunk's sequence number and instance.
func runChat(t *testing.T, c openai.Client, p openai.ChatCompletionNewParams, each func(seq int, instance string), opts ...option.RequestOption) chatOutput {
	t.Helper()
	st := c.Chat.Completions.NewStreaming(context.Background(), p, opts...)
	s := chatOutput{instances: map[string]bool{}}
	for st.Next() {
		ch := st.Current()
		s.id = ch.ID
		if len(ch.Choices) > 0 {
			d := ch.Choices[0]
			s.text += d.Delta.Content
			s.logprobs = append(s.logprobs, d.Logprobs.Content...)
			for _, tc := range d.Delta.ToolCalls {
				s.calls = append(s.calls, streamedCall{tc.ID, tc.Function.Name, tc.Function.Arguments})
			}
			if d.FinishReason != "" {
				s.finish = d.FinishReason
			}
		}
		var ll struct {
			SequenceNo int      `json:"sequence_no"`
			InstanceID string   `json:"instance_id"`
			Migrations int      `json:"migrations"`
			ToolCalls  []string `json:"tool_calls"`
		}
		json.Unmarshal([]byte(ch.JSON.ExtraFields["lifeline"].Raw()), &ll)
		if ll.InstanceID != "" {
			s.instances[ll.InstanceID] = true
			s.tokens = append(s.tokens, ll.SequenceNo)
			if each != nil {
				each(ll.SequenceNo, ll.InstanceID)
			}
		} else if len(ch.Choices) > 0 && ch.Choices[0].FinishReason != "" {
			s.migrations, s.endCalls = ll.Migrations, ll.ToolCalls
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}
