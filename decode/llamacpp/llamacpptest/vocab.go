package llamacpptest

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
)

// Llama32Vocab is a real vocabulary: Llama 3.2's byte-level BPE (128,000
// tokens and their merges, from the test data of the ollama module this
// repository builds llama.cpp from) with Llama 3's special tokens
// appended as control tokens.
func Llama32Vocab(t testing.TB) (tokens []string, types []int32, merges []string) {
	t.Helper()
	dir := filepath.Join(ollamaDir(t), "tokenizer", "testdata", "llama3.2")
	raw, err := os.ReadFile(filepath.Join(dir, "encoder.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ids map[string]int
	if err := json.Unmarshal(raw, &ids); err != nil {
		t.Fatal(err)
	}
	tokens, types = make([]string, len(ids)), make([]int32, len(ids))
	for tok, id := range ids {
		tokens[id], types[id] = tok, 1
	}
	for _, sp := range []string{"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"} {
		tokens, types = append(tokens, sp), append(types, 3)
	}
	f, err := os.Open(filepath.Join(dir, "vocab.bpe"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") {
			merges = append(merges, l)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return tokens, types, merges
}

// Gemma2TokenizerModel is the path of a real SentencePiece BPE model:
// Gemma 2's tokenizer.model (256,000 pieces, byte fallback), from the
// same test data.
func Gemma2TokenizerModel(t testing.TB) string {
	t.Helper()
	return filepath.Join(ollamaDir(t), "tokenizer", "testdata", "gemma2", "tokenizer.model")
}

func ollamaDir(t testing.TB) string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ollama/ollama").Output()
	if err != nil {
		t.Fatalf("go list the ollama module: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// WriteVocab writes a GGUF that holds only a llama model's header and
// the vocabulary vocab states (tokenizer.ggml.* keys): what llama.cpp
// loads with vocab_only.
func WriteVocab(t testing.TB, dir string, vocab []gguf.KV) string {
	t.Helper()
	kvs := append([]gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "llama.context_length", Value: uint32(512)},
		{Key: "llama.embedding_length", Value: uint32(64)},
		{Key: "llama.block_count", Value: uint32(1)},
		{Key: "llama.feed_forward_length", Value: uint32(128)},
		{Key: "llama.attention.head_count", Value: uint32(4)},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
	}, vocab...)
	path := filepath.Join(dir, "vocab.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := gguf.Write(f, kvs, nil); err != nil {
		t.Fatal(err)
	}
	return path
}

// VocabKVs is the tokenizer metadata of arch's test vocabulary ("llama":
// SentencePiece; "qwen2": byte-level BPE).
func VocabKVs(arch string) []gguf.KV {
	kvs, _ := vocabKVs(arch)
	return kvs
}
