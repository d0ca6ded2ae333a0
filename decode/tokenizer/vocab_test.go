package tokenizer_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

func vocabOf(t *testing.T, arch string) *tokenizer.Vocab {
	t.Helper()
	f, err := gguf.Open(llamacpptest.WriteVocab(t, t.TempDir(), llamacpptest.VocabKVs(arch)))
	if err != nil {
		t.Fatal(err)
	}
	v, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestVocabRoundTrips: for a SentencePiece and a byte-level BPE
// vocabulary, the pieces of a text's tokens spell the text (with
// SentencePiece's leading space), special tokens written in it become
// themselves, and a stream detokenizes to the same text.
func TestVocabRoundTrips(t *testing.T) {
	texts := []string{"Hello world", "the quick brown fox\n\n  jumps", "中文 🙂 é\u0301", "a<|im_end|>b", "x\ty  z   ", "<0x41>"}
	for _, arch := range []string{"llama", "qwen2"} {
		t.Run(arch, func(t *testing.T) {
			v := vocabOf(t, arch)
			for _, text := range texts {
				ids, err := v.Encode(text)
				if err != nil {
					t.Fatal(err)
				}
				var got []byte
				for _, id := range ids {
					got = append(got, v.Piece(-1, id)...)
				}
				want := text
				if arch == "llama" {
					want = " " + text
				}
				if arch == "qwen2" && strings.Contains(text, "<|im_end|>") {
					want = strings.ReplaceAll(text, "<|im_end|>", "") // control tokens spell nothing
					if !slices.ContainsFunc(ids, func(id int) bool { return slices.Contains(v.EndOfGeneration(), id) }) {
						t.Errorf("%q: %v has no end-of-turn token", text, ids)
					}
				}
				if string(got) != want {
					t.Errorf("%q: ids %v spell %q", text, ids, got)
				}
				if d := tokenizer.Decode(v, ids); d != want {
					t.Errorf("%q: streamed %q", text, d)
				}
			}
		})
	}
}

// TestVocabMergesAsLlamaCpp: on equal merge ranks (and equal scores) the
// leftmost pair merges first; a pre-token that is itself a token is taken
// whole only where the pre-tokenizer says so.
func TestVocabMergesAsLlamaCpp(t *testing.T) {
	bpe, err := tokenizer.NewVocab(tokenizer.Spec{Model: "gpt2", Pre: "default", Tokens: []string{"a", "aa", "b", "ab", "aab"},
		Merges: []string{"a a", "a b"}, BOS: -1, EOS: -1, EOT: -1, Unknown: -1})
	if err != nil {
		t.Fatal(err)
	}
	if ids, _ := bpe.Encode("aaa"); !slices.Equal(ids, []int{1, 0}) {
		t.Errorf("aaa: %v, want [aa a] = [1 0]", ids)
	}
	if ids, _ := bpe.Encode("aab"); !slices.Equal(ids, []int{1, 2}) {
		t.Errorf("aab without ignore_merges: %v, want [aa b] = [1 2]", ids)
	}
	spm, err := tokenizer.NewVocab(tokenizer.Spec{Model: "llama", Tokens: []string{"<unk>", "▁", "a", "aa", "<0x62>"},
		Scores: []float32{0, 1, 1, 2, 0}, Types: []int32{2, 1, 1, 1, 6}, BOS: -1, EOS: -1, EOT: -1, Unknown: 0})
	if err != nil {
		t.Fatal(err)
	}
	if ids, _ := spm.Encode("aaab"); !slices.Equal(ids, []int{3, 2, 4}) {
		t.Errorf("aaab: %v, want [aa a <0x62>] = [3 2 4]", ids)
	}
	if ids, _ := spm.Encode("a aa"); !slices.Equal(ids, []int{2, 1, 3}) {
		t.Errorf("a aa: %v, want [a ▁ aa] = [2 1 3]", ids)
	}
	if _, err := spm.Encode("\xff"); !errors.Is(err, tokenizer.ErrInvalidUTF8) {
		t.Errorf("invalid UTF-8: %v", err)
	}
}

// TestVocabRefusesWhatItCannotEncode: each malformed or unsupported
// vocabulary is refused by name, as ErrUnsupportedVocab.
func TestVocabRefusesWhatItCannotEncode(t *testing.T) {
	base := func() tokenizer.Spec {
		return tokenizer.Spec{Model: "gpt2", Pre: "qwen2", Tokens: []string{"a", "b", "ab"}, Merges: []string{"a b"}, BOS: -1, EOS: -1, EOT: -1, Unknown: -1}
	}
	for _, c := range []struct {
		name, want string
		edit       func(*tokenizer.Spec)
	}{
		{"model", `tokenizer model "bert"`, func(s *tokenizer.Spec) { s.Model = "bert" }},
		{"pre", `pre-tokenizer "tekken"`, func(s *tokenizer.Spec) { s.Pre = "tekken" }},
		{"types", "2 token types for 3 tokens", func(s *tokenizer.Spec) { s.Types = []int32{1, 1} }},
		{"scores", "0 scores for 3 SentencePiece tokens", func(s *tokenizer.Spec) { s.Model = "llama" }},
		{"merge", `merge 0 ("ab")`, func(s *tokenizer.Spec) { s.Merges = []string{"ab"} }},
		{"special id", "special token id 3 outside the 3 tokens", func(s *tokenizer.Spec) { s.EOS = 3 }},
		{"empty", "0 tokens", func(s *tokenizer.Spec) { s.Tokens = nil }},
	} {
		s := base()
		c.edit(&s)
		_, err := tokenizer.NewVocab(s)
		if !errors.Is(err, tokenizer.ErrUnsupportedVocab) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrUnsupportedVocab naming %q", c.name, err, c.want)
		}
	}
	kvs := llamacpptest.VocabKVs("qwen2")
	for i := range kvs {
		if kvs[i].Key == "tokenizer.ggml.token_type" {
			kvs[i].Value = gguf.Strings([]string{"x"})
		}
	}
	path := llamacpptest.WriteVocab(t, t.TempDir(), kvs)
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tokenizer.FromGGUF(f); !errors.Is(err, tokenizer.ErrUnsupportedVocab) || !strings.Contains(err.Error(), "tokenizer.ggml.token_type[0] is a string") {
		t.Errorf("string token types: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "empty.gguf")
	if out, err := os.Create(empty); err != nil {
		t.Fatal(err)
	} else if err := gguf.Write(out, []gguf.KV{{Key: "general.architecture", Value: "llama"}}, nil); err != nil {
		t.Fatal(err)
	} else {
		out.Close()
	}
	if f, err = gguf.Open(empty); err != nil {
		t.Fatal(err)
	}
	if _, err := tokenizer.FromGGUF(f); !errors.Is(err, tokenizer.ErrUnsupportedVocab) || !strings.Contains(err.Error(), "no tokenizer.ggml.tokens") {
		t.Errorf("no vocabulary: %v", err)
	}
}

// TestFromHFEncodesAsFromGGUF: the test vocabularies written as Hugging
// Face files (tokenizer.json; tokenizer.model) encode the corpus as the
// same vocabularies read from GGUF, with the same special tokens, and
// carry the chat template.
func TestFromHFEncodesAsFromGGUF(t *testing.T) {
	for _, arch := range []string{"llama", "qwen2"} {
		t.Run(arch, func(t *testing.T) {
			g := vocabOf(t, arch)
			dir := t.TempDir()
			if err := llamacpptest.WriteHFTokenizer(dir, llamacpptest.HFTokenizerOf(arch)); err != nil {
				t.Fatal(err)
			}
			h, err := tokenizer.FromHF(dir)
			if err != nil {
				t.Fatal(err)
			}
			if h.VocabSize() != g.VocabSize() || h.BOS() != g.BOS() || h.EOS() != g.EOS() || h.AddBOS() != g.AddBOS() || !slices.Equal(h.EndOfGeneration(), g.EndOfGeneration()) {
				t.Fatalf("HF size/BOS/EOS/AddBOS/EOG %d/%d/%d/%t/%v, GGUF %d/%d/%d/%t/%v", h.VocabSize(), h.BOS(), h.EOS(), h.AddBOS(), h.EndOfGeneration(),
					g.VocabSize(), g.BOS(), g.EOS(), g.AddBOS(), g.EndOfGeneration())
			}
			for _, text := range corpus() {
				a, _ := h.Encode(text)
				b, _ := g.Encode(text)
				if !slices.Equal(a, b) {
					t.Fatalf("%q: HF %v, GGUF %v", text, a, b)
				}
			}
			if tmpl := tokenizer.ChatTemplateHF(dir); tmpl != llamacpptest.ChatML {
				t.Errorf("chat template %q", tmpl)
			}
		})
	}
}

// TestFromHFRefusesWhatItCannotEncode: a pre-tokenizer pattern it does
// not know, a unigram SentencePiece model and a directory with neither
// file are refused by name.
func TestFromHFRefusesWhatItCannotEncode(t *testing.T) {
	bpe := llamacpptest.HFTokenizerOf("qwen2")
	bpe.Split = `\w+`
	dir := t.TempDir()
	if err := llamacpptest.WriteHFTokenizer(dir, bpe); err != nil {
		t.Fatal(err)
	}
	if _, err := tokenizer.FromHF(dir); !errors.Is(err, tokenizer.ErrUnsupportedVocab) || !strings.Contains(err.Error(), `splits on "\\w+"`) {
		t.Errorf("unknown split: %v", err)
	}
	spm := llamacpptest.HFTokenizerOf("llama")
	dir = t.TempDir()
	if err := llamacpptest.WriteHFTokenizer(dir, spm); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.model"))
	if err != nil {
		t.Fatal(err)
	}
	// The trainer spec's model_type 2 (BPE) becomes 1 (unigram).
	i := strings.LastIndex(string(raw), "\x12\x02\x18\x02")
	raw[i+3] = 1
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.model"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tokenizer.FromHF(dir); !errors.Is(err, tokenizer.ErrUnsupportedVocab) || !strings.Contains(err.Error(), "not a BPE SentencePiece model") {
		t.Errorf("unigram: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.model"), raw[:len(raw)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tokenizer.FromHF(dir); !errors.Is(err, tokenizer.ErrUnsupportedVocab) || !strings.Contains(err.Error(), "tokenizer.model") {
		t.Errorf("truncated tokenizer.model: %v", err)
	}
	if _, err := tokenizer.FromHF(t.TempDir()); !errors.Is(err, tokenizer.ErrUnsupportedVocab) || !strings.Contains(err.Error(), "neither a byte-level tokenizer.json nor") {
		t.Errorf("empty directory: %v", err)
	}
}

// TestHostileVocabulariesRefused: an added token id past any vocabulary,
// a token of megabytes, and tokens that together spell gigabytes are
// refused by name, before memory is spent on them.
func TestHostileVocabulariesRefused(t *testing.T) {
	dir := t.TempDir()
	h := llamacpptest.HFTokenizerOf("qwen2")
	if err := llamacpptest.WriteHFTokenizer(dir, h); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	huge := strings.Replace(string(raw), `"added_tokens":[`, `"added_tokens":[{"id":9223372036854775807,"content":"x","special":true},`, 1)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(huge), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tokenizer.FromHF(dir); !errors.Is(err, tokenizer.ErrUnsupportedVocab) || !strings.Contains(err.Error(), "has id 9223372036854775807") {
		t.Errorf("an added id of 2^63-1: %v", err)
	}
	long := tokenizer.Spec{Model: "gpt2", Pre: "qwen2", Tokens: []string{"a", strings.Repeat("中", 3000)}, Merges: []string{}, BOS: -1, EOS: -1, EOT: -1, Unknown: -1}
	if _, err := tokenizer.NewVocab(long); !errors.Is(err, tokenizer.ErrUnsupportedVocab) || !strings.Contains(err.Error(), "token 1 is 9000 bytes long") {
		t.Errorf("a token of 9000 bytes: %v", err)
	}
	many := tokenizer.Spec{Model: "gpt2", Pre: "qwen2", Merges: []string{}, BOS: -1, EOS: -1, EOT: -1, Unknown: -1}
	for i := range 20 { // each spells ~5 MB: llama.cpp writes the token again per unknown rune
		many.Tokens = append(many.Tokens, fmt.Sprintf("%d%s", i, strings.Repeat("中", 1300)))
	}
	if _, err := tokenizer.NewVocab(many); !errors.Is(err, tokenizer.ErrUnsupportedVocab) || !strings.Contains(err.Error(), "spell over") {
		t.Errorf("tokens spelling gigabytes: %v", err)
	}
}

// TestSpecialTokensTypedAsLlamaCppTypesThem: fill-in-the-middle padding,
// repository and file separators end generation, the other
// fill-in-the-middle tokens are control tokens, and an added token that
// looks special is one even when tokenizer.json says otherwise.
func TestSpecialTokensTypedAsLlamaCppTypesThem(t *testing.T) {
	v, err := tokenizer.NewVocab(tokenizer.Spec{Model: "gpt2", Pre: "qwen2", Tokens: []string{"a", "<|fim_pad|>", "<|file_sep|>", "<|fim_prefix|>", "<|im_end|>"},
		Merges: []string{}, BOS: -1, EOS: 4, EOT: -1, Unknown: -1})
	if err != nil {
		t.Fatal(err)
	}
	if got := v.EndOfGeneration(); !slices.Equal(got, []int{1, 2, 4}) || !v.IsSpecial(3) || len(v.Piece(-1, 3)) != 0 {
		t.Errorf("end of generation %v (want [1 2 4]); <|fim_prefix|> special %t, spells %q", got, v.IsSpecial(3), v.Piece(-1, 3))
	}
	dir := t.TempDir()
	h := llamacpptest.HFTokenizerOf("qwen2")
	h.Tokens = append(slices.Clone(h.Tokens), "<|tool_call|>", "▁hello")
	h.Types = append(slices.Clone(h.Types), 4, 4) // added, not special
	if err := llamacpptest.WriteHFTokenizer(dir, h); err != nil {
		t.Fatal(err)
	}
	hv, err := tokenizer.FromHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := hv.VocabSize()
	if !hv.IsSpecial(n-2) || len(hv.Piece(-1, n-2)) != 0 || string(hv.Piece(-1, n-1)) != " hello" {
		t.Errorf("<|tool_call|> special %t (spells %q); ▁hello spells %q", hv.IsSpecial(n-2), hv.Piece(-1, n-2), hv.Piece(-1, n-1))
	}
}
