package tokenizer_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// FuzzVocabEncode: any text encodes without error under the SentencePiece
// and the byte-level BPE vocabularies, every id in range; text without
// special tokens spells itself back (after SentencePiece's space; "▁"
// in text is SentencePiece's space, spelled " ").
func FuzzVocabEncode(f *testing.F) {
	for _, s := range corpus()[:40] {
		f.Add(s)
	}
	var vocabs []*tokenizer.Vocab
	for _, arch := range []string{"llama", "qwen2"} {
		dir := f.TempDir()
		if err := llamacpptest.WriteHFTokenizer(dir, llamacpptest.HFTokenizerOf(arch)); err != nil {
			f.Fatal(err)
		}
		v, err := tokenizer.FromHF(dir)
		if err != nil {
			f.Fatal(err)
		}
		vocabs = append(vocabs, v)
	}
	f.Fuzz(func(t *testing.T, text string) {
		if !utf8.ValidString(text) {
			return
		}
		special := strings.Contains(text, "<") // every special token of the test vocabularies starts so
		for i, v := range vocabs {
			ids, err := v.Encode(text)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			for _, id := range ids {
				if id < 0 || id >= v.VocabSize() {
					t.Fatalf("id %d outside %d", id, v.VocabSize())
				}
				b.Write(v.Piece(-1, id))
			}
			want := text
			if i == 0 && text != "" {
				want = " " + text
			}
			if !special && !(i == 0 && strings.Contains(text, "▁")) && b.String() != want {
				t.Fatalf("vocabulary %d: %q spells %q", i, text, b.String())
			}
		}
	})
}

// FuzzFromHFFiles: any bytes as tokenizer.model, tokenizer.json or
// tokenizer_config.json give a vocabulary or an error, never a panic.
func FuzzFromHFFiles(f *testing.F) {
	seed := f.TempDir()
	if err := llamacpptest.WriteHFTokenizer(seed, llamacpptest.HFTokenizerOf("llama")); err != nil {
		f.Fatal(err)
	}
	model, err := os.ReadFile(filepath.Join(seed, "tokenizer.model"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(model[:2000], []byte(`{"bos_token":"<s>","eos_token":{"content":"</s>"}}`), []byte(`{"added_tokens":[{"id":5,"content":"<x>","special":true}]}`))
	f.Add([]byte{}, []byte(`{"eos_token":[1,2]}`), []byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a","a"]]},"pre_tokenizer":{"type":"ByteLevel","use_regex":true}}`))
	f.Fuzz(func(t *testing.T, model, config, tj []byte) {
		dir := t.TempDir()
		for name, b := range map[string][]byte{"tokenizer.model": model, "tokenizer_config.json": config, "tokenizer.json": tj} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		tokenizer.FromHF(dir)
	})
}
