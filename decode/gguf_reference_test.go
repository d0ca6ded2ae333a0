//go:build llamacpp

package decode

import (
	"errors"
	"math"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/llamacpp"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// TestReferenceEngineReadsGGUFAsLlamaCppDoes: the reference engine
// computes a llama GGUF with F32 weights (mapped in place) and decodes
// the same 128 greedy tokens as llama.cpp on the same file; the largest
// logit difference is logged. A file of another weight type is refused
// by name.
func TestReferenceEngineReadsGGUFAsLlamaCppDoes(t *testing.T) {
	path := llamacpptest.WriteModel(t, t.TempDir(), llamacpptest.Small, 1)
	m, err := model.LoadGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	tok := tokenizer.NewBuiltin()
	store, err := kvcache.NewMemStore(kvcache.NewLayout(m.Config.Layers, m.Config.KVDim(), kvcache.DefaultBlockSize), 64)
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEngineWith(m, tok, store, sched.Limits{MaxRunning: 2, MaxQueued: 2, MaxStepTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ids := make([]int, 20)
	for i := range ids {
		ids[i] = 5 + i*97%(m.Config.VocabSize-5)
	}
	const n = 128
	got := generate(t, e, Request{PromptTokens: ids, MaxTokens: n, IgnoreEOS: true, KeepLogits: true, Sampling: sample.Params{}})

	lm, err := llamacpp.LoadModel(path, llamacpp.ModelParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	c, err := lm.NewContext(llamacpp.ContextParams{Context: 256, Sequences: 1, Batch: 256, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prompt := append([]int{tok.BOS()}, ids...)
	var in []llamacpp.Input
	for i, id := range prompt {
		in = append(in, llamacpp.Input{Pos: int32(i), Token: int32(id), Logits: i == len(prompt)-1})
	}
	var logits []float32
	worst := 0.0
	for i := range n {
		if err := c.Decode(in); err != nil {
			t.Fatal(err)
		}
		if logits, err = c.Logits(0, logits); err != nil {
			t.Fatal(err)
		}
		for j, v := range logits {
			worst = max(worst, math.Abs(float64(v-got.events[i].Logits[j])))
		}
		want, _ := c.LlamaGreedy(0)
		if int(want) != got.events[i].TokenID {
			t.Fatalf("token %d: the reference engine %d, llama.cpp %d (largest logit difference so far %.3g)", i, got.events[i].TokenID, want, worst)
		}
		in = []llamacpp.Input{{Pos: int32(len(prompt) + i), Token: want, Logits: true}}
	}
	t.Logf("%d greedy tokens identical; largest logit difference %.3g", n, worst)

	shape := llamacpptest.Tiny
	shape.Weights = gguf.Q8_0
	if _, err := model.LoadGGUF(llamacpptest.WriteModel(t, t.TempDir(), shape, 1)); !errors.Is(err, model.ErrUnsupportedGGUF) {
		t.Fatalf("a Q8_0 file: %v, want ErrUnsupportedGGUF", err)
	}
}
