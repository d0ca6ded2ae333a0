//go:build llamacpp

package tokenizer_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// TestVocabEncodesAsLlamaCpp: on the same GGUF, the tokenizer's ids are
// llama.cpp's for every string of the corpus, for SentencePiece and for
// byte-level BPE with each pre-tokenizer, on the test vocabularies and on
// Llama 3.2's real one; pieces are llama.cpp's for every token.
func TestVocabEncodesAsLlamaCpp(t *testing.T) {
	tokens, types, merges := llamacpptest.Llama32Vocab(t)
	llama3 := func(pre string) []gguf.KV {
		return []gguf.KV{
			{Key: "tokenizer.ggml.model", Value: "gpt2"},
			{Key: "tokenizer.ggml.pre", Value: pre},
			{Key: "tokenizer.ggml.tokens", Value: gguf.Strings(tokens)},
			{Key: "tokenizer.ggml.token_type", Value: gguf.Int32s(types)},
			{Key: "tokenizer.ggml.merges", Value: gguf.Strings(merges)},
			{Key: "tokenizer.ggml.bos_token_id", Value: uint32(slices.Index(tokens, "<|begin_of_text|>"))},
			{Key: "tokenizer.ggml.eos_token_id", Value: uint32(slices.Index(tokens, "<|eot_id|>"))},
		}
	}
	hf := func(t *testing.T, h llamacpptest.HFTokenizer, model string) []gguf.KV {
		dir := t.TempDir()
		if err := llamacpptest.WriteHFTokenizer(dir, h); err != nil {
			t.Fatal(err)
		}
		if model != "" {
			raw, err := os.ReadFile(model)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "tokenizer.model"), raw, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		v, err := tokenizer.FromHF(dir)
		if err != nil {
			t.Fatal(err)
		}
		return v.GGUF()
	}
	no := false
	cases := []struct {
		name string
		kvs  []gguf.KV
	}{
		{"hf-llama3.2-tokenizer.json", hf(t, llamacpptest.HFTokenizer{Tokens: tokens, Types: types, Merges: merges, Split: llamacpptest.Llama3Split,
			BOS: "<|begin_of_text|>", EOS: "<|eot_id|>"}, "")},
		{"hf-gemma2-tokenizer.model", hf(t, llamacpptest.HFTokenizer{BOS: "<bos>", EOS: "<eos>", AddBOS: &no}, llamacpptest.Gemma2TokenizerModel(t))},
		{"spm-test-vocab", llamacpptest.VocabKVs("llama")},
		{"bpe-qwen2-test-vocab", llamacpptest.VocabKVs("qwen2")},
		{"bpe-llama3.2-llama-bpe", llama3("llama-bpe")},
		{"bpe-llama3.2-qwen2", llama3("qwen2")},
		{"bpe-llama3.2-default", llama3("default")},
		{"bpe-llama3.2-gpt-2", llama3("gpt-2")},
	}
	texts := corpus()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := llamacpptest.WriteVocab(t, t.TempDir(), c.kvs)
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			v, err := tokenizer.FromGGUF(f)
			if err != nil {
				t.Fatal(err)
			}
			lm, err := llamacpp.LoadModel(path, llamacpp.ModelParams{VocabOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer lm.Close()
			ref := lm.Tokenizer()
			if v.VocabSize() != ref.VocabSize() || v.BOS() != ref.BOS() || v.EOS() != ref.EOS() || v.AddBOS() != ref.AddBOS() {
				t.Fatalf("size/BOS/EOS/AddBOS %d/%d/%d/%t, llama.cpp %d/%d/%d/%t", v.VocabSize(), v.BOS(), v.EOS(), v.AddBOS(), ref.VocabSize(), ref.BOS(), ref.EOS(), ref.AddBOS())
			}
			if got, want := v.EndOfGeneration(), ref.EndOfGeneration(); !slices.Equal(got, want) {
				t.Errorf("end of generation %v, llama.cpp %v", got, want)
			}
			bad := 0
			for _, text := range texts {
				got, err := v.Encode(text)
				if err != nil {
					t.Fatalf("%q: %v", text, err)
				}
				want, err := ref.Encode(text)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					if bad++; bad <= 5 {
						t.Errorf("%q:\n got %v\nwant %v", text, got, want)
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d strings encode differently", bad, len(texts))
			}
			badPieces := 0
			for id := range v.VocabSize() {
				if got, want := v.Piece(-1, id), ref.Piece(-1, id); string(got) != string(want) {
					if badPieces++; badPieces <= 5 {
						t.Errorf("piece of %d: %q, llama.cpp %q", id, got, want)
					}
				}
			}
			t.Logf("%d strings, %d tokens: identical ids and pieces", len(texts), v.VocabSize())
		})
	}
}
