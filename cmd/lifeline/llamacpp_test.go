//go:build llamacpp

package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/llamacpp"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestEngineGenerateThroughLlamaCpp: a lifeline built with llama.cpp
// streams a GGUF model's generation — greedy, and seeded at temperature
// 0.9 — token for token what the binding's own loop generates, the text
// the tokens' pieces, the finish reason "length".
func TestEngineGenerateThroughLlamaCpp(t *testing.T) {
	path := llamacpptest.WriteModel(t, t.TempDir(), llamacpptest.Tiny, 1)
	for _, temp := range []string{"0", "0.9"} {
		out, errOut, err := proctest.Run(t, "engine", "generate", "--engine", "llamacpp", "--model", path, "--prompt", "Once upon a time",
			"--max-tokens", "24", "--temperature", temp, "--seed", "5", "--ignore-eos", "--json", "--threads", "2")
		if err != nil {
			t.Fatalf("temperature %s: %v\n%s", temp, err, errOut)
		}
		var got []decode.TokenLine
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var tl decode.TokenLine
			if err := json.Unmarshal([]byte(l), &tl); err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			got = append(got, tl)
		}
		want := loopTokens(t, path, "Once upon a time", 24, temp, 5)
		if len(got) != 25 || got[24].FinishReason != "length" {
			t.Fatalf("temperature %s: %d lines, last %+v", temp, len(got), got[len(got)-1])
		}
		for i, w := range want {
			if got[i].SequenceNo != i+1 || got[i].TokenID != int(w.ID) || got[i].Text != w.Text {
				t.Fatalf("temperature %s: line %d %+v, the binding's loop %+v", temp, i, got[i], w)
			}
		}
	}
}

// loopTokens is the binding's own loop over the model at path.
func loopTokens(t *testing.T, path, prompt string, n int, temp string, seed uint64) []llamacpp.Token {
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
	p := sample.Params{Seed: seed, TopP: 0.95}
	if temp == "0.9" {
		p.Temperature = 0.9
	}
	var out []llamacpp.Token
	if _, err := llamacpp.Generate(t.Context(), m, c, llamacpp.GenerateRequest{Prompt: prompt, MaxTokens: n, Sampling: p, IgnoreEOS: true},
		func(tk llamacpp.Token) { out = append(out, tk) }); err != nil {
		t.Fatal(err)
	}
	return out
}
