package decode

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// checkpoints writes the test models as GGUF files (F32, and F16, BF16
// and Q8_0 matrices) and as Hugging Face directories (F32, F16, BF16): llama
// (SentencePiece) and qwen2 (byte-level BPE).
func checkpoints(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, shape := range []llamacpptest.Shape{llamacpptest.Tiny, llamacpptest.TinyQwen2} {
		path := llamacpptest.WriteModel(t, t.TempDir(), shape, 3)
		out["gguf-"+shape.Arch] = path
		g, err := model.LoadGGUF(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, dtype := range []string{"F32", "F16", "BF16"} {
			dir := filepath.Join(t.TempDir(), "hf-"+shape.Arch+"-"+dtype)
			if err := llamacpptest.WriteHFAs(mkdir(t, dir), g, shape.Arch, shape.Arch == "llama", dtype); err != nil {
				t.Fatal(err)
			}
			out[filepath.Base(dir)] = dir
		}
		for _, typ := range []gguf.TensorType{gguf.F16, gguf.BF16, gguf.Q8_0} {
			typed := shape
			typed.Weights = typ
			out["gguf-"+shape.Arch+"-"+typ.String()] = llamacpptest.WriteModel(t, t.TempDir(), typed, 3)
		}
	}
	return out
}

// TestCheckpointsServeBitExact: a GGUF file or a Hugging Face directory
// given as ModelPath, with weights of every type the engine reads, is
// served by the reference engine with the vocabulary and chat template
// it holds, under its own name, and keeps the engine's promise: a
// continuation from any split point, batched with the others, reproduces
// the uninterrupted run's tokens, text and logits bit for bit.
func TestCheckpointsServeBitExact(t *testing.T) {
	t.Parallel()
	for name, path := range checkpoints(t) {
		t.Run(name, func(t *testing.T) {
			if err := CheckModel(path); err != nil {
				t.Fatal(err)
			}
			e, err := NewEngine(Options{ModelPath: path, Limits: sched.Limits{MaxRunning: 16, MaxQueued: 64, MaxStepTokens: 128}})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if _, ok := e.Tokenizer.(*tokenizer.Vocab); !ok || !e.ChatTemplated() {
				t.Fatalf("tokenizer %T, chat templated %t", e.Tokenizer, e.ChatTemplated())
			}
			if want := strings.TrimSuffix(filepath.Base(path), ".gguf"); e.ModelName() != want {
				t.Errorf("served as %q, want %q", e.ModelName(), want)
			}
			const n = 24
			base := Request{Messages: []ChatMessage{{"user", "Tell me about the river"}}, MaxTokens: n, IgnoreEOS: true, KeepLogits: true,
				Sampling: sample.Params{Temperature: 0.9, TopP: 0.95, Seed: 7}}
			full := generate(t, e, base)
			if len(full.events) != n {
				t.Fatalf("%d tokens, finish %+v", len(full.events), full.finish)
			}
			ids := make([]int, n)
			for i, ev := range full.events {
				ids[i] = ev.TokenID
			}
			var chans []<-chan Event
			splits := []int{0, 1, 7, 16, n - 1}
			for _, k := range splits {
				r := base
				r.PrefixTokens = ids[:k]
				ch, err := e.Generate(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				chans = append(chans, ch)
			}
			for i, ch := range chans {
				k := splits[i]
				got := collect(t, ch)
				if len(got.events) != n-k {
					t.Fatalf("k=%d: %d tokens", k, len(got.events))
				}
				for j, ev := range got.events {
					want := full.events[k+j]
					if ev.TokenID != want.TokenID || ev.Text != want.Text {
						t.Fatalf("k=%d event %d: (%d,%q), want (%d,%q)", k, j, ev.TokenID, ev.Text, want.TokenID, want.Text)
					}
					for x := range ev.Logits {
						if math.Float32bits(ev.Logits[x]) != math.Float32bits(want.Logits[x]) {
							t.Fatalf("k=%d seq %d: logit %d differs", k, ev.SequenceNo, x)
						}
					}
				}
			}
			if st := e.Stats(); st.FreeBlocks != st.TotalBlocks {
				t.Fatalf("blocks leaked: %+v", st)
			}
		})
	}
}

// TestCheckpointRefusals: a weight type the engine does not compute, a
// tokenizer file beside a checkpoint that holds its own, and a path that
// is no checkpoint are refused by name before anything loads.
func TestCheckpointRefusals(t *testing.T) {
	shape := llamacpptest.Tiny
	shape.Weights = gguf.Q4_0
	q4 := llamacpptest.WriteModel(t, t.TempDir(), shape, 1)
	if err := CheckModel(q4); !errors.Is(err, model.ErrUnsupportedGGUF) || !strings.Contains(err.Error(), "Q4_0") {
		t.Errorf("Q4_0 file: %v", err)
	}
	f32 := llamacpptest.WriteModel(t, t.TempDir(), llamacpptest.Tiny, 1)
	o := Options{ModelPath: f32, TokenizerPath: "/x/tokenizer.bin"}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "holds its own vocabulary") {
		t.Errorf("tokenizer beside a GGUF: %v", err)
	}
	if err := CheckModel(t.TempDir() + "/nothing"); err == nil || !strings.Contains(err.Error(), "neither a GGUF file nor a Hugging Face directory") {
		t.Errorf("no checkpoint: %v", err)
	}
	if err := CheckModel(t.TempDir()); !errors.Is(err, model.ErrUnsupportedHF) {
		t.Errorf("empty directory: %v", err)
	}
	// An embedding with rows past the last token (Qwen2.5's): the
	// vocabulary is padded to it, as llama.cpp's converter pads it.
	g, err := model.LoadGGUF(llamacpptest.WriteModel(t, t.TempDir(), llamacpptest.TinyQwen2, 1))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := llamacpptest.WriteHF(dir, g, "qwen2", false); err != nil {
		t.Fatal(err)
	}
	h := llamacpptest.HFTokenizerOf("qwen2")
	h.Tokens, h.Types = h.Tokens[:len(h.Tokens)-1], h.Types[:len(h.Types)-1] // <|im_end|> gone: a row without a token
	h.EOS = "<|endoftext|>"
	if err := llamacpptest.WriteHFTokenizer(dir, h); err != nil {
		t.Fatal(err)
	}
	if err := CheckModel(dir); err != nil {
		t.Errorf("a vocabulary one token short of the embedding: %v", err)
	}
}

func mkdir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
