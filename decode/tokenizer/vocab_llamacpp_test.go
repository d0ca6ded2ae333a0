//go:build llamacpp

package tokenizer_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// corpus is what the tokenizers are checked on: Unicode of several
// scripts, whitespace runs, code, CJK, emoji (with joiners and
// modifiers), contractions, numbers, special tokens in and around text,
// and strings drawn at random from all of these.
func corpus() []string {
	c := []string{
		"", " ", "  ", "\n", "\t", " \n\n  \t", "Hello world", " Hello world", "Hello  world   ", "hello\n\nworld\n",
		"I'm sure you're right, they'll say it's what we'd've done. I'M SURE YOU'RE", "don't DON'T Don'T",
		"1 12 123 1234 12345 1234567890 3.14159 -42 1e-5 0x1F ½ ² ١٢٣ ४२",
		"func main() {\n\tfmt.Println(\"héllo, 世界\")\n\tx := []int{1, 2, 3} // comment\n}\n",
		"def f(x):\n    return x**2  # square\n\n\nclass A:\n        pass",
		`{"key": "value", "n": [1, 2.5, null], "nested": {"a": true}}`,
		"https://example.com/path?q=1&r=two#frag <a href=\"x\">link</a>",
		"中文测试：你好，世界！这是一个句子。日本語のテキストです。한국어 문장입니다.",
		"Привет, мир! Ελληνικά κείμενα. עברית. العربية نص. हिन्दी पाठ। ภาษาไทย",
		"emoji 🙂🚀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 1️⃣",
		"combining: e\u0301 a\u0308 n\u0303; zero-width: a\u200bb\u200dc; nbsp:\u00a0x; ideographic space:\u3000y",
		"ALL CAPS WORDS and MiXeD CaSe and snake_case and camelCaseWords and kebab-case",
		"tabs\tand\t\ttabs\r\nwindows\r\nlines   \n   \n",
		"punctuation!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((())) [[]] {{}} <<>> ~~ || \\\\ //",
		"<s>", "</s>", "<unk>", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|im_start|><|im_end|>",
		"text<|endoftext|>more", " <|im_end|> spaced ", "<|im_", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
		"<0x41> <0xFF>", "▁already▁escaped", "a\x00b", "\u2028line\u2029para",
	}
	pool := []rune(strings.Join(c, "") + "    \n\n\t")
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var sb strings.Builder
		for range 1 + r.IntN(60) {
			sb.WriteRune(pool[r.IntN(len(pool))])
		}
		c = append(c, sb.String())
	}
	return c
}

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
	cases := []struct {
		name string
		kvs  []gguf.KV
	}{
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
