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
)

// TestReferenceEngineReadsGGUFAsLlamaCppDoes: the reference engine
// computes llama and qwen2 GGUFs with F32 weights (mapped in place) as
// llama.cpp does on the same file: over 128 greedy tokens, llama.cpp's
// choice after each of the reference engine's is the same token unless
// the two are a near-tie (within tieMargin); the ties and the largest
// logit difference are logged. A file of another weight type is refused
// by name.
func TestReferenceEngineReadsGGUFAsLlamaCppDoes(t *testing.T) {
	for _, shape := range []llamacpptest.Shape{llamacpptest.Small, llamacpptest.TinyQwen2, llama3Rope()} {
		t.Run(shape.Arch+map[bool]string{true: "-llama3-rope"}[shape.Llama3Rope], func(t *testing.T) {
			path := llamacpptest.WriteModel(t, t.TempDir(), shape, 1)
			m, err := model.LoadGGUF(path)
			if err != nil {
				t.Fatal(err)
			}
			crossCheck(t, path, m, 128)
		})
	}
	shape := llamacpptest.Tiny
	shape.Weights = gguf.Q4_0
	if _, err := model.LoadGGUF(llamacpptest.WriteModel(t, t.TempDir(), shape, 1)); !errors.Is(err, model.ErrUnsupportedGGUF) {
		t.Fatalf("a Q4_0 file: %v, want ErrUnsupportedGGUF", err)
	}
}

// TestReferenceEngineOnTypedGGUFsAgainstLlamaCpp reports, for F16, BF16
// and Q8_0 files, where the reference engine's greedy tokens first part
// from llama.cpp's on the same file and the largest logit difference:
// the reference engine computes in float32 on the decoded weights,
// llama.cpp rounds the activations to the weights' type (F16, BF16,
// Q8_0) before its dot products, so near-ties may go either way. A clear
// choice made otherwise fails, as for F32.
func TestReferenceEngineOnTypedGGUFsAgainstLlamaCpp(t *testing.T) {
	for _, typ := range []gguf.TensorType{gguf.F16, gguf.BF16, gguf.Q8_0} {
		t.Run(typ.String(), func(t *testing.T) {
			shape := llamacpptest.Small
			shape.Weights = typ
			path := llamacpptest.WriteModel(t, t.TempDir(), shape, 1)
			m, err := model.LoadGGUF(path)
			if err != nil {
				t.Fatal(err)
			}
			crossCheckWithin(t, path, m, 128, typedTieMargin)
		})
	}
}

// typedTieMargin is crossCheck's tieMargin for files whose activations
// llama.cpp rounds to F16, BF16 or Q8_0.
const typedTieMargin = 0.25

// TestReferenceEngineReadsHFAsLlamaCppReadsItsGGUF: the same weights as
// a Hugging Face directory (safetensors, query and key rows in the
// rotate-half layout the converter to GGUF permutes) compute on the
// reference engine as llama.cpp computes the GGUF.
func TestReferenceEngineReadsHFAsLlamaCppReadsItsGGUF(t *testing.T) {
	for _, shape := range []llamacpptest.Shape{llamacpptest.Small, llamacpptest.TinyQwen2, llama3Rope()} {
		t.Run(shape.Arch+map[bool]string{true: "-llama3-rope"}[shape.Llama3Rope], func(t *testing.T) {
			path := llamacpptest.WriteModel(t, t.TempDir(), shape, 1)
			g, err := model.LoadGGUF(path)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if err := llamacpptest.WriteHF(dir, g, shape.Arch, shape.Arch == "llama"); err != nil {
				t.Fatal(err)
			}
			m, err := model.LoadHF(dir)
			if err != nil {
				t.Fatal(err)
			}
			crossCheck(t, path, m, 128)
		})
	}
}

// llama3Rope is the small shape with Llama 3's RoPE frequency scaling
// (a rope_freqs tensor; rope_scaling in its Hugging Face directory).
func llama3Rope() llamacpptest.Shape {
	s := llamacpptest.Small
	s.Llama3Rope = true
	return s
}

// crossCheck decodes n greedy tokens on m (the reference engine) and
// checks each against llama.cpp's choice on the GGUF at path, fed m's
// tokens: a clear choice must be the same.
func crossCheck(t *testing.T, path string, m *model.Model, n int) {
	t.Helper()
	crossCheckWithin(t, path, m, n, tieMargin)
}

// crossCheckWithin is crossCheck with logits margin apart counted as a
// near-tie.
func crossCheckWithin(t *testing.T, path string, m *model.Model, n int, margin float32) {
	lm, err := llamacpp.LoadModel(path, llamacpp.ModelParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	tok := lm.Tokenizer() // the file's vocabulary: ids and BOS as llama.cpp has them
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
	got := generate(t, e, Request{PromptTokens: ids, MaxTokens: n, IgnoreEOS: true, KeepLogits: true, Sampling: sample.Params{}})

	c, err := lm.NewContext(llamacpp.ContextParams{Context: 256, Sequences: 1, Batch: 256, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prompt := ids
	if tok.AddBOS() {
		prompt = append([]int{tok.BOS()}, ids...)
	}
	var in []llamacpp.Input
	for i, id := range prompt {
		in = append(in, llamacpp.Input{Pos: int32(i), Token: int32(id), Logits: i == len(prompt)-1})
	}
	var logits []float32
	worst, ties, firstTie := 0.0, 0, -1
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
		ours := got.events[i].TokenID
		if int(want) != ours {
			// Two sums of another order may rank a near-tie otherwise;
			// a clear choice must be the same.
			if apart := logits[want] - logits[ours]; apart > margin {
				t.Fatalf("token %d: the reference engine %d, llama.cpp %d, %.3g apart (largest logit difference so far %.3g)", i, ours, want, apart, worst)
			}
			ties++
			if firstTie < 0 {
				firstTie = i
			}
		}
		// llama.cpp follows the reference engine's tokens (teacher
		// forcing), so that every position is compared.
		in = []llamacpp.Input{{Pos: int32(len(prompt) + i), Token: int32(ours), Logits: true}}
	}
	t.Logf("%s: %d greedy tokens, %d near-ties ranked otherwise (first divergence at %d); largest logit difference %.3g", m.Config.Name, n, ties, firstTie, worst)
}

// tieMargin is how far apart two logits may be and still be ranked
// otherwise by llama.cpp: the logits differ by up to about 2·10⁻³.
const tieMargin = 1e-2
