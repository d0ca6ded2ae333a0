//go:build llamacpp

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/decode/llamacpp"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// TestUpServesAGGUFThroughLlamaCpp: `lifeline up --engine llamacpp`
// serves a qwen2 GGUF file (byte-level BPE, ChatML template) on two
// nodes. Greedy tokens through Lifeline are llama.cpp's own greedy
// decode of the same prompt; a seeded stream whose decode worker is
// SIGKILLed mid-stream continues on the other node token for token as
// the fault-free run; the official OpenAI SDK streams a chat rendered
// with the file's own template (the same tokens as a completion of the
// ChatML text).
func TestUpServesAGGUFThroughLlamaCpp(t *testing.T) {
	path := llamacpptest.WriteModel(t, t.TempDir(), llamacpptest.TinyQwen2, 3)
	dir := t.TempDir()
	up := startUp(t, dir, "--nodes", "2", "--engine", "llamacpp", "--model", path, "--served-model-name", "qwen-test", "--threads", "1")

	const prompt = "Once upon a time, the little robot"
	greedy, _ := clustertest.StreamCompletion(t, up.url, map[string]any{"model": "qwen-test", "prompt": prompt, "max_tokens": 24,
		"temperature": 0, "ignore_eos": true, "stream": true}, nil)
	if want := llamaCppGreedy(t, path, prompt, 24); fmt.Sprint(tokenIDs(greedy)) != fmt.Sprint(want) {
		t.Fatalf("greedy through Lifeline %v, llama.cpp's own %v", tokenIDs(greedy), want)
	}

	// Killed at token 80: the worker saved its sequence's K/V at 64
	// positions (sched.SnapshotEvery) into its node's arena, which
	// outlives it; the next worker, on the other node, pulls and imports
	// it, and computes only the rest.
	seeded := map[string]any{"model": "qwen-test", "prompt": prompt, "max_tokens": 100, "temperature": 0.9, "seed": 11,
		"ignore_eos": true, "stream": true}
	reference, refEnd := clustertest.StreamCompletion(t, up.url, seeded, nil)
	var victim string
	got, end := clustertest.StreamCompletion(t, up.url, seeded, func(tok clustertest.Token) {
		if tok.Seq != 80 {
			return
		}
		victim = tok.Instance
		node := strings.Split(tok.Instance, "-decode-")[0]
		ws, err := nodectl.Workers(context.Background(), filepath.Join(dir, node, "agent.sock"))
		if err != nil || len(ws) != 1 {
			t.Errorf("workers of %s: %v %v", node, ws, err)
			return
		}
		syscall.Kill(ws[0].PID, syscall.SIGKILL)
	})
	if victim == "" {
		t.Fatal("no worker was killed")
	}
	t.Logf("killed %s at 80; %d tokens, last from %s; end %v", victim, len(got), got[len(got)-1].Instance, end["lifeline"])
	if !sameTokens(got, reference) {
		t.Fatalf("stream through a SIGKILL of %s: %d tokens %v, the fault-free run %v", victim, len(got), tokenIDs(got), tokenIDs(reference))
	}
	if last := got[len(got)-1].Instance; last == victim {
		t.Fatalf("the stream ended on the killed instance %s", victim)
	}
	if m, reused := lifelineField(end, "migrations"), lifelineField(end, "kv_reused_positions"); m < 1 || reused < 64 || lifelineField(refEnd, "kv_reused_positions") != 0 {
		t.Fatalf("migrations %v, KV positions imported %v (want the 64 saved), fault-free run's %v", m, reused, lifelineField(refEnd, "kv_reused_positions"))
	}
	// The workers' start-up check found this build's logits invariant,
	// and the end says the continuation was bit-exact, as it was.
	if l, _ := end["lifeline"].(map[string]any); l["continuation"] != "bit-exact" {
		t.Fatalf("the end of a migrated stream says continuation %v", l["continuation"])
	}

	// The official SDK: a chat is rendered with the file's template.
	c := openai.NewClient(option.WithBaseURL(up.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	st := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{Model: "qwen-test",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello there")},
		MaxCompletionTokens: openai.Int(12), Temperature: openai.Float(0)}, option.WithJSONSet("ignore_eos", true))
	var chat strings.Builder
	for st.Next() {
		if ch := st.Current(); len(ch.Choices) > 0 {
			chat.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	rendered, err := llamacpp.ApplyTemplate(llamacpptest.ChatML, []llamacpp.ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello there"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	completion, _ := clustertest.StreamCompletion(t, up.url, map[string]any{"model": "qwen-test", "prompt": rendered, "max_tokens": 12,
		"temperature": 0, "ignore_eos": true, "stream": true}, nil)
	var want strings.Builder
	for _, tok := range completion {
		want.WriteString(tok.Text)
	}
	t.Logf("chat %q", chat.String())
	if chat.String() != want.String() || chat.Len() == 0 {
		t.Fatalf("chat through the SDK %q, completion of the ChatML text %q", chat.String(), want.String())
	}
	checkUsageAndLogprobs(t, c, path, rendered, chat.String())
}

// checkUsageAndLogprobs: the same chat with logprobs, not streamed,
// counts its prompt in the model's own tokens (the frontend's tokenizer
// is not the file's) and spells its tokens with the model's vocabulary:
// their bytes are the message's.
func checkUsageAndLogprobs(t *testing.T, c openai.Client, path, rendered, want string) {
	t.Helper()
	resp, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "qwen-test",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello there")},
		MaxCompletionTokens: openai.Int(12), Temperature: openai.Float(0), Logprobs: openai.Bool(true), TopLogprobs: openai.Int(2)},
		option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	m, err := llamacpp.LoadModel(path, llamacpp.ModelParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ids, err := m.Tokenize(rendered, true, true)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Usage.PromptTokens != int64(len(ids)) {
		t.Errorf("usage.prompt_tokens %d, the model's tokens of the rendered chat %d", resp.Usage.PromptTokens, len(ids))
	}
	var b []byte
	for _, lp := range resp.Choices[0].Logprobs.Content {
		for _, x := range lp.Bytes {
			b = append(b, byte(x))
		}
	}
	if got := resp.Choices[0].Message.Content; got != want || string(b) != got {
		t.Errorf("logprobs' bytes %q, message %q, streamed %q", b, got, want)
	}
}

// llamaCppGreedy is llama.cpp's own greedy decode of prompt in the model
// at path: its tokenizer (BOS as the vocabulary says), its greedy
// sampler.
func llamaCppGreedy(t *testing.T, path, prompt string, n int) []int {
	t.Helper()
	m, err := llamacpp.LoadModel(path, llamacpp.ModelParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := m.NewContext(llamacpp.ContextParams{Context: 512, Sequences: 1, Batch: 512, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ids, err := m.Tokenize(prompt, true, true)
	if err != nil {
		t.Fatal(err)
	}
	var in []llamacpp.Input
	for i, id := range ids {
		in = append(in, llamacpp.Input{Pos: int32(i), Token: id, Logits: i == len(ids)-1})
	}
	var out []int
	for len(out) < n {
		if err := c.Decode(in); err != nil {
			t.Fatal(err)
		}
		next, err := c.LlamaGreedy(0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, int(next))
		in = []llamacpp.Input{{Pos: int32(len(ids) + len(out) - 1), Token: next, Logits: true}}
	}
	return out
}
