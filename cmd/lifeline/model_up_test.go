package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// colorSchema keeps a structured answer within max_tokens and long
// enough (10 to 12 colours, some 40 tokens) for a kill to land mid-stream:
// an array of enums and a boolean.
const colorSchema = `{"type":"object","properties":{"colors":{"type":"array","items":{"type":"string","enum":["red","green","blue"]},"minItems":10,"maxItems":12},` +
	`"ok":{"type":"boolean"}},"required":["colors","ok"]}`

// TestUpServesAHFDirectoryOnTheReferenceEngine: `lifeline up --model DIR`
// with a Hugging Face directory (qwen2: safetensors, a byte-level BPE
// tokenizer.json, the ChatML template) and no --engine serves it on the
// reference engine; for a plain seeded completion, a chat with logprobs
// and a json_schema chat, the decode worker serving the stream is
// SIGKILLed mid-stream and the stream continues on the other node
// identical to the fault-free run: tokens, text, logprobs, a valid value.
func TestUpServesAHFDirectoryOnTheReferenceEngine(t *testing.T) {
	t.Parallel()
	shape := llamacpptest.Small // slow enough on one thread that a kill lands mid-stream
	shape.Arch = "qwen2"
	g, err := model.LoadGGUF(llamacpptest.WriteModel(t, t.TempDir(), shape, 3))
	if err != nil {
		t.Fatal(err)
	}
	hf := filepath.Join(t.TempDir(), "qwen-hf")
	if err := os.Mkdir(hf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := llamacpptest.WriteHF(hf, g, "qwen2", false); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	up := startUp(t, dir, "--nodes", "2", "--model", hf, "--threads", "1")
	if !strings.Contains(up.out.String(), hf+": engine lifeline") {
		t.Fatalf("up did not say it serves %s on the reference engine:\n%s", hf, up.out.String())
	}
	kill := func(at int) (func(seq int, instance string), *string) {
		killed := new(string)
		return func(seq int, instance string) {
			if seq < at || *killed != "" {
				return
			}
			*killed = instance
			node := strings.Split(instance, "-decode-")[0]
			ws, err := nodectl.Workers(context.Background(), filepath.Join(dir, node, "agent.sock"))
			if err != nil || len(ws) != 1 {
				t.Errorf("workers of %s: %v %v", node, ws, err)
				return
			}
			syscall.Kill(ws[0].PID, syscall.SIGKILL)
		}, killed
	}

	t.Run("plain", func(t *testing.T) {
		body := map[string]any{"model": "qwen-hf", "prompt": "Once upon a time", "max_tokens": 160, "temperature": 0.9, "seed": 11,
			"ignore_eos": true, "stream": true}
		want, _ := clustertest.StreamCompletion(t, up.url, body, nil)
		each, killed := kill(30)
		got, end := clustertest.StreamCompletion(t, up.url, body, func(tok clustertest.Token) { each(tok.Seq, tok.Instance) })
		if *killed == "" || !sameTokens(got, want) || got[len(got)-1].Instance == *killed || lifelineField(end, "migrations") < 1 {
			t.Fatalf("killed %q; %d tokens %v, fault-free %v; end %v", *killed, len(got), tokenIDs(got), tokenIDs(want), end["lifeline"])
		}
	})

	c := openai.NewClient(option.WithBaseURL(up.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	chat := func(prompt string, maxTokens int64) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: "qwen-hf", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
			MaxCompletionTokens: openai.Int(maxTokens), Seed: openai.Int(5), Temperature: openai.Float(0.9)}
	}
	t.Run("logprobs", func(t *testing.T) {
		p := chat("Tell me a story", 160)
		p.Logprobs, p.TopLogprobs = openai.Bool(true), openai.Int(3)
		want := sdkChat(t, c, p, nil, option.WithJSONSet("ignore_eos", true))
		each, killed := kill(30)
		got := sdkChat(t, c, p, each, option.WithJSONSet("ignore_eos", true))
		w, _ := json.Marshal(want.logprobs)
		gl, _ := json.Marshal(got.logprobs)
		if *killed == "" || len(got.instances) < 2 || got.text != want.text || string(w) != string(gl) || len(want.logprobs) != 160 {
			t.Fatalf("killed %q, instances %v:\n%q\n%s\nwant\n%q\n%s", *killed, got.instances, got.text, gl, want.text, w)
		}
	})
	t.Run("json_schema", func(t *testing.T) {
		rf := option.WithJSONSet("response_format", map[string]any{"type": "json_schema",
			"json_schema": map[string]any{"name": "c", "strict": true, "schema": json.RawMessage(colorSchema)}})
		p := chat("Pick a color", 120)
		want := sdkChat(t, c, p, nil, rf)
		checkValue(t, want.text)
		if want.tokens < 30 {
			t.Fatalf("a value of %d tokens: too short for a kill to land mid-stream", want.tokens)
		}
		each, killed := kill(8)
		got := sdkChat(t, c, p, each, rf)
		// The worker runs ahead of the client's reading: on a busy
		// machine it may have sent every character of the value by the
		// time the kill lands, and the new worker only ends the stream.
		// The stream must still have moved, bit-exact.
		if *killed == "" || got.migrations < 1 || got.continuation != "bit-exact" || got.text != want.text {
			t.Fatalf("killed %q, instances %v, %d migrations (%q): %q, want %q", *killed, got.instances, got.migrations, got.continuation, got.text, want.text)
		}
		checkValue(t, got.text)
	})
}

// checkValue checks text against colorSchema with the engine's own
// automaton.
func checkValue(t *testing.T, text string) {
	t.Helper()
	a, err := grammar.Compile([]byte(colorSchema))
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := a.Advance(a.Start(), []byte(text)); !ok || !a.Accepting(s) || !json.Valid([]byte(text)) {
		t.Fatalf("%q is not a value of %s", text, colorSchema)
	}
}

type sdkOutput struct {
	text      string
	tokens    int
	logprobs  []openai.ChatCompletionTokenLogprob
	instances map[string]bool
	// migrations is the end chunk's count of moves to another worker.
	migrations int
	// continuation is the end chunk's guarantee of a migrated stream.
	continuation string
}

// sdkChat streams a chat through the official SDK, calling each with
// every token chunk's sequence number and instance.
func sdkChat(t *testing.T, c openai.Client, p openai.ChatCompletionNewParams, each func(int, string), opts ...option.RequestOption) sdkOutput {
	t.Helper()
	st := c.Chat.Completions.NewStreaming(context.Background(), p, opts...)
	out := sdkOutput{instances: map[string]bool{}}
	for st.Next() {
		ch := st.Current()
		if len(ch.Choices) > 0 {
			out.text += ch.Choices[0].Delta.Content
			out.logprobs = append(out.logprobs, ch.Choices[0].Logprobs.Content...)
		}
		var l struct {
			SequenceNo   int    `json:"sequence_no"`
			InstanceID   string `json:"instance_id"`
			Migrations   int    `json:"migrations"`
			Continuation string `json:"continuation"`
		}
		json.Unmarshal([]byte(ch.JSON.ExtraFields["lifeline"].Raw()), &l)
		out.migrations = max(out.migrations, l.Migrations)
		if l.Continuation != "" {
			out.continuation = l.Continuation
		}
		if l.InstanceID != "" {
			out.instances[l.InstanceID] = true
			out.tokens++
			if each != nil {
				each(l.SequenceNo, l.InstanceID)
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(fmt.Errorf("chat: %w", err))
	}
	return out
}

// lifelineField is a number of the final chunk's "lifeline" object.
func lifelineField(end map[string]any, name string) float64 {
	l, _ := end["lifeline"].(map[string]any)
	v, _ := l[name].(float64)
	return v
}

func tokenIDs(toks []clustertest.Token) []int {
	var out []int
	for _, t := range toks {
		out = append(out, t.TokenID)
	}
	return out
}

// TestModelFileCheckedAtConfigTime: an instance of the reference engine
// with a model file is checked by `agent --check-config` and by
// `lifeline up` before anything starts: a GGUF file and a Hugging Face
// directory it computes pass; a weight type it does not compute, a
// relative path and a prefill role are refused by name, and `up` without
// --engine says why the reference engine does not serve the file.
func TestModelFileCheckedAtConfigTime(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := llamacpptest.WriteModel(t, t.TempDir(), llamacpptest.Tiny, 1)
	g, err := model.LoadGGUF(good)
	if err != nil {
		t.Fatal(err)
	}
	hf := filepath.Join(dir, "hf")
	if err := os.Mkdir(hf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := llamacpptest.WriteHF(hf, g, "llama", true); err != nil {
		t.Fatal(err)
	}
	q4shape := llamacpptest.Tiny
	q4shape.Weights = gguf.Q4_0
	q4 := llamacpptest.WriteModel(t, t.TempDir(), q4shape, 1)
	ca := clustertest.CADir(t)
	certs := clustertest.Issue(t, ca, "agent", "a")
	check := func(engine, model, role string) (string, error) {
		cfg := fmt.Sprintf(`{"node_id": "a", "data_dir": %q, "socket": "s", "etcd": ["127.0.0.1:1"], "certs": %q, "arena": "/dev/shm/x",
			"instances": [{"role": %q, "engine": %q, "model": %q, "count": 1}]}`, dir, certs, role, engine, model)
		p := filepath.Join(dir, "agent.json")
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		out, errOut, err := proctest.Run(t, "agent", "--config", p, "--check-config")
		return out + errOut, err
	}
	for _, c := range []struct{ engine, model, role, want string }{
		{"", good, "decode", "config OK"},
		{"lifeline", hf, "both", "config OK"},
		{"lifeline", q4, "decode", `is Q4_0 (the reference engine reads F32, and F16, BF16 or Q8_0 matrices) (engine "llamacpp" may serve it)`},
		{"", "relative.gguf", "decode", "an absolute path"},
		{"", good, "prefill", "instances[0].role"},
	} {
		out, err := check(c.engine, c.model, c.role)
		if ok := c.want == "config OK"; (err == nil) != ok || !strings.Contains(out, c.want) || strings.Contains(out, "panic") {
			t.Errorf("agent --check-config, %s %s as %s: %v %q, want it to say %q", c.engine, c.model, c.role, err, out, c.want)
		}
	}
	data := filepath.Join(t.TempDir(), "up")
	args := []string{"up", "--data-dir", data, "--model", q4, "--listen", proctest.FreeTCPAddr(t)}
	want := []string{"Lifeline's engine does not serve it", "Q4_0", "built without llama.cpp"}
	if gguf.Linked { // it would be served by llama.cpp: ask for the reference engine
		args, want = append(args, "--engine", "lifeline"), []string{"Q4_0", `--engine llamacpp may serve it`}
	}
	out, errOut, err := proctest.Run(t, args...)
	for _, w := range want {
		if err == nil || !strings.Contains(errOut, w) || strings.Contains(out, "URL") {
			t.Errorf("up --model %s: %v %q %q, want it refused saying %q", q4, err, out, errOut, w)
		}
	}
	if _, err := os.Stat(data); err == nil {
		t.Error("up made its data directory before refusing the file")
	}
}
