package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// TestOpenAISDKConformance drives a real cluster (two decode workers) with
// the official OpenAI Go SDK: completions and chat, whole and streamed,
// every supported parameter, the refusals (each a 400 naming its
// parameter), unknown models, paths and methods, and a worker SIGKILLed
// mid-stream that the SDK never notices.
func TestOpenAISDKConformance(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	url := clustertest.StartFrontend(t, n)
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()
	eos := option.WithJSONSet("ignore_eos", true)

	t.Run("completion", func(t *testing.T) {
		var resp *http.Response
		p := openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(8), Temperature: openai.Float(0.8), TopP: openai.Float(0.9), Seed: openai.Int(7),
			FrequencyPenalty: openai.Float(0.1), PresencePenalty: openai.Float(0.1), User: openai.String("u"), N: openai.Int(1)}
		topK := option.WithJSONSet("top_k", 40)
		got, err := c.Completions.New(ctx, p, eos, topK, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(got.ID, "cmpl-") || got.Created == 0 || !strings.HasPrefix(got.SystemFingerprint, "fp_") || len(got.Choices) != 1 ||
			got.Usage.CompletionTokens != 8 || got.Usage.PromptTokens < 2 || got.Usage.TotalTokens != got.Usage.PromptTokens+8 || resp.Header.Get("Lifeline-Seed") != "7" {
			t.Fatalf("completion %s (seed header %q)", got.RawJSON(), resp.Header.Get("Lifeline-Seed"))
		}
		// Streamed, the same text; a stop string cuts it.
		if s := streamText(t, c, p, eos, topK); s != got.Choices[0].Text {
			t.Fatalf("streamed %q, whole %q", s, got.Choices[0].Text)
		}
		p.Stop = openai.CompletionNewParamsStopUnion{OfStringArray: []string{got.Choices[0].Text[2:4], "\x01"}}
		cut, err := c.Completions.New(ctx, p, eos, topK)
		if err != nil || cut.Choices[0].FinishReason != "stop" || len(cut.Choices[0].Text) >= len(got.Choices[0].Text) {
			t.Fatalf("stop array: %v %s", err, cut.RawJSON())
		}
		p.Stop = openai.CompletionNewParamsStopUnion{OfString: openai.String(got.Choices[0].Text[2:4])}
		if cut2, err := c.Completions.New(ctx, p, eos, topK); err != nil || cut2.Choices[0].Text != cut.Choices[0].Text {
			t.Fatalf("stop string: %v %s", err, cut2.RawJSON())
		}
		// A token-id prompt.
		ids, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{5, 6, 7, 8}},
			MaxTokens: openai.Int(4), Seed: openai.Int(1)}, eos)
		if err != nil || ids.Usage.PromptTokens != 5 || ids.Usage.CompletionTokens != 4 {
			t.Fatalf("token prompt: %v %s", err, ids.RawJSON())
		}
	})

	t.Run("chat", func(t *testing.T) {
		msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"),
			openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{openai.TextContentPart("hello "), openai.TextContentPart("there")})}
		p := openai.ChatCompletionNewParams{Model: "tiny", Messages: msgs, MaxCompletionTokens: openai.Int(3), Seed: openai.Int(3)}
		got, err := c.Chat.Completions.New(ctx, p, eos)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(got.ID, "chatcmpl-") || got.Created == 0 || got.SystemFingerprint == "" || got.Choices[0].Message.Role != "assistant" ||
			got.Usage.CompletionTokens != 3 || got.Usage.TotalTokens != got.Usage.PromptTokens+3 {
			t.Fatalf("chat %s", got.RawJSON())
		}
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		st := c.Chat.Completions.NewStreaming(ctx, p, eos)
		var text strings.Builder
		role, usage := "", int64(0)
		for st.Next() {
			ch := st.Current()
			if len(ch.Choices) > 0 {
				text.WriteString(ch.Choices[0].Delta.Content)
				role += ch.Choices[0].Delta.Role
			} else if ch.Usage.TotalTokens > 0 {
				usage = ch.Usage.CompletionTokens
			}
			if !strings.HasPrefix(ch.ID, "chatcmpl-") || ch.Created == 0 {
				t.Fatalf("chunk %s", ch.RawJSON())
			}
		}
		if err := st.Err(); err != nil || text.String() != got.Choices[0].Message.Content || role != "assistant" || usage != 3 {
			t.Fatalf("streamed chat %q role %q usage %d: %v", text.String(), role, usage, err)
		}
	})

	t.Run("seeds", func(t *testing.T) {
		p := openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("The cat")},
			MaxTokens: openai.Int(24), Temperature: openai.Float(1)}
		var r1, r2 *http.Response
		a, err := c.Completions.New(ctx, p, eos, option.WithResponseInto(&r1))
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Completions.New(ctx, p, eos, option.WithResponseInto(&r2))
		if err != nil || a.Choices[0].Text == b.Choices[0].Text {
			t.Fatalf("two unseeded requests: %v, %q and %q", err, a.Choices[0].Text, b.Choices[0].Text)
		}
		var seed int64
		json.Unmarshal([]byte(a.JSON.ExtraFields["lifeline"].Raw()), &struct{ Seed *int64 }{&seed})
		if h := r1.Header.Get("Lifeline-Seed"); h == "" || h == r2.Header.Get("Lifeline-Seed") || seed == 0 {
			t.Fatalf("seeds %q %q, lifeline %s", h, r2.Header.Get("Lifeline-Seed"), a.JSON.ExtraFields["lifeline"].Raw())
		}
		p.Seed = openai.Int(seed)
		again, err := c.Completions.New(ctx, p, eos)
		if err != nil || again.Choices[0].Text != a.Choices[0].Text {
			t.Fatalf("with the reported seed: %v, %q, want %q", err, again.Choices[0].Text, a.Choices[0].Text)
		}
	})

	t.Run("logit_bias", func(t *testing.T) {
		the, err := tokenizer.NewBuiltin().Encode(" the")
		if err != nil || len(the) != 1 {
			t.Fatalf("\" the\" is %v (%v): want one token", the, err)
		}
		p := openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(6), Temperature: openai.Float(0.9), Seed: openai.Int(3), LogitBias: map[string]int64{fmt.Sprint(the[0]): 100}}
		r, err := c.Completions.New(ctx, p, eos)
		if err != nil || r.Choices[0].Text != strings.Repeat(" the", 6) {
			t.Fatalf("logit_bias +100 on \" the\": %v, %q", err, r.Choices[0].Text)
		}
		p.LogitBias = nil
		free, err := c.Completions.New(ctx, p, eos)
		if err != nil || free.Choices[0].Text == r.Choices[0].Text {
			t.Fatalf("the same request without the bias: %v, %q", err, free.Choices[0].Text)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		base := func() openai.CompletionNewParams {
			return openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(2)}
		}
		for param, set := range map[string]func(*openai.CompletionNewParams){
			// logprobs and echo work (conformance_structured_process_test.go):
			// what is refused is past their range, or their combination.
			"n": func(p *openai.CompletionNewParams) { p.N = openai.Int(17) }, "logprobs": func(p *openai.CompletionNewParams) { p.Logprobs = openai.Int(6) },
			"echo":       func(p *openai.CompletionNewParams) { p.Echo, p.Logprobs = openai.Bool(true), openai.Int(1) },
			"best_of":    func(p *openai.CompletionNewParams) { p.BestOf = openai.Int(3) },
			"logit_bias": func(p *openai.CompletionNewParams) { p.LogitBias = map[string]int64{"999999": 10} }, // past the vocabulary
			"suffix":     func(p *openai.CompletionNewParams) { p.Suffix = openai.String("z") },
			"top_p":      func(p *openai.CompletionNewParams) { p.TopP = openai.Float(3) },
		} {
			p := base()
			set(&p)
			_, err := c.Completions.New(ctx, p)
			wantAPIError(t, err, 400, param, "")
			// Streamed: the same 400, before any stream starts.
			st := c.Completions.NewStreaming(ctx, p)
			for st.Next() {
			}
			wantAPIError(t, st.Err(), 400, param, "")
		}
		cp := openai.ChatCompletionNewParams{Model: "tiny", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}}
		// response_format and tools work (conformance_structured_process_test.go):
		// what is refused is a format or tools of the wrong shape.
		for param, opt := range map[string]option.RequestOption{"response_format": option.WithJSONSet("response_format", map[string]any{"type": "yaml"}),
			"tools":       option.WithJSONSet("tools", map[string]any{"type": "function", "function": map[string]any{"name": "f"}}),
			"tool_choice": option.WithJSONSet("tool_choice", "required"), "top_logprobs": option.WithJSONSet("top_logprobs", 3),
			"functions": option.WithJSONSet("functions", []any{map[string]any{"name": "f"}}), "parallel_tool_calls": option.WithJSONSet("parallel_tool_calls", true),
			"prediction": option.WithJSONSet("prediction", map[string]any{"type": "content", "content": "x"}), "audio": option.WithJSONSet("audio", map[string]any{"voice": "alloy", "format": "wav"}),
			"modalities": option.WithJSONSet("modalities", []string{"text", "audio"}), "top_k": option.WithJSONSet("top_k", int64(4294967297))} {
			_, err := c.Chat.Completions.New(ctx, cp, opt)
			wantAPIError(t, err, 400, param, "")
		}
		// Past the model's context: the worker's refusal, before the status line.
		p := base()
		p.MaxTokens = openai.Int(100000)
		st := c.Completions.NewStreaming(ctx, p)
		for st.Next() {
		}
		wantAPIError(t, st.Err(), 400, "max_tokens", "context_length_exceeded")
		p = base()
		p.Model = "nope"
		_, err := c.Completions.New(ctx, p)
		wantAPIError(t, err, 404, "model", "model_not_found")
		_, err = c.Models.Get(ctx, "nope")
		wantAPIError(t, err, 404, "model", "model_not_found")
		if m, err := c.Models.Get(ctx, "tiny"); err != nil || m.ID != "tiny" {
			t.Fatalf("model: %v %+v", err, m)
		}
		for path, status := range map[string]int{"/v1/nothing": 404, "/v1/completions": 405} {
			resp, err := http.Get(url + path)
			if err != nil {
				t.Fatal(err)
			}
			var e struct {
				Error struct{ Message, Type string }
			}
			err = json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if resp.StatusCode != status || err != nil || e.Error.Message == "" || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("GET %s: %d %v %+v", path, resp.StatusCode, err, e)
			}
		}
	})

	t.Run("worker killed", func(t *testing.T) {
		p := openai.ChatCompletionNewParams{Model: "tiny", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a story")},
			MaxCompletionTokens: openai.Int(200), Seed: openai.Int(11), Temperature: openai.Float(0.9)}
		want, _ := chatStream(t, c, p, nil, eos)
		killed := ""
		got, instances := chatStream(t, c, p, func(seq int, instance string) {
			if seq == 20 && killed == "" {
				killed = instance
				for _, w := range n.NodectlWorkers(t) {
					if w.InstanceID == instance {
						syscall.Kill(w.PID, syscall.SIGKILL)
					}
				}
			}
		}, eos)
		if killed == "" || got != want || !instances[killed] || len(instances) < 2 {
			t.Fatalf("killed %q; instances %v; got %q, want %q", killed, instances, got, want)
		}
	})
}

func wantAPIError(t *testing.T, err error, status int, param, code string) {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) || e.StatusCode != status || e.Param != param || (code != "" && e.Code != code) || strings.Contains(e.Message, "decode:") {
		t.Fatalf("want a %d naming %q (code %q), got %v", status, param, code, err)
	}
}

func streamText(t *testing.T, c openai.Client, p openai.CompletionNewParams, opts ...option.RequestOption) string {
	t.Helper()
	st := c.Completions.NewStreaming(context.Background(), p, opts...)
	var b strings.Builder
	for st.Next() {
		if ch := st.Current(); len(ch.Choices) > 0 {
			b.WriteString(ch.Choices[0].Text)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// chatStream streams a chat completion through the SDK, calling each with
// every token's sequence number and instance (the lifeline extension).
func chatStream(t *testing.T, c openai.Client, p openai.ChatCompletionNewParams, each func(seq int, instance string), opts ...option.RequestOption) (string, map[string]bool) {
	t.Helper()
	st := c.Chat.Completions.NewStreaming(context.Background(), p, opts...)
	var b strings.Builder
	seen := map[string]bool{}
	for st.Next() {
		ch := st.Current()
		if len(ch.Choices) > 0 {
			b.WriteString(ch.Choices[0].Delta.Content)
		}
		var ll struct {
			SequenceNo int    `json:"sequence_no"`
			InstanceID string `json:"instance_id"`
		}
		json.Unmarshal([]byte(ch.JSON.ExtraFields["lifeline"].Raw()), &ll)
		if ll.InstanceID != "" {
			seen[ll.InstanceID] = true
			if each != nil {
				each(ll.SequenceNo, ll.InstanceID)
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String(), seen
}
