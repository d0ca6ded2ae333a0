// Package llamacpptest writes GGUF models for tests of the llama.cpp
// binding and of what runs on it: a llama architecture with random F32
// weights and the built-in vocabulary as a SentencePiece one. No real
// weights can be downloaded here; these exercise the same code.
package llamacpptest

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// Shape is the shape of a model WriteModel writes.
type Shape struct {
	embd, layers, heads, kvHeads, ff, ctx int
}

// ChatML is the chat template WriteModel gives its models (Qwen's family).
const ChatML = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

// Tiny is the shape tests use: 2 layers of 64, 4 heads over 2 KV heads.
var Tiny = Shape{embd: 64, layers: 2, heads: 4, kvHeads: 2, ff: 128, ctx: 512}

// SPMVocab is the built-in tokenizer's vocabulary as a SentencePiece one:
// <unk>, <s>, </s>, the 256 byte tokens, then pieces with "▁" for a
// space, longer pieces scored higher (SentencePiece merges by score).
func SPMVocab() (tokens []string, scores []float32, types []int32) {
	b := tokenizer.NewBuiltin()
	for i := range b.VocabSize() {
		p := b.PieceString(i)
		typ, score := int32(1), float32(len(p))
		switch {
		case i == 0:
			typ = 2
		case i <= 2:
			typ = 3
		case strings.HasPrefix(p, "<0x") && len(p) == 6:
			typ, score = 6, 0
		}
		tokens = append(tokens, strings.ReplaceAll(p, " ", "▁"))
		scores, types = append(scores, score), append(types, typ)
	}
	return
}

// WriteModel writes a llama GGUF of shape s with random F32 weights (seed)
// and a SentencePiece vocabulary to dir, and returns its path.
func WriteModel(t testing.TB, dir string, s Shape, seed uint64) string {
	t.Helper()
	tokens, scores, types := SPMVocab()
	kvs := []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "general.name", Value: "lifeline-test"},
		{Key: "llama.context_length", Value: uint32(s.ctx)},
		{Key: "llama.embedding_length", Value: uint32(s.embd)},
		{Key: "llama.block_count", Value: uint32(s.layers)},
		{Key: "llama.feed_forward_length", Value: uint32(s.ff)},
		{Key: "llama.attention.head_count", Value: uint32(s.heads)},
		{Key: "llama.attention.head_count_kv", Value: uint32(s.kvHeads)},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
		{Key: "llama.rope.freq_base", Value: float32(10000)},
		{Key: "tokenizer.ggml.model", Value: "llama"},
		{Key: "tokenizer.ggml.tokens", Value: gguf.Strings(tokens)},
		{Key: "tokenizer.ggml.scores", Value: gguf.Float32s(scores)},
		{Key: "tokenizer.ggml.token_type", Value: gguf.Int32s(types)},
		{Key: "tokenizer.ggml.bos_token_id", Value: uint32(1)},
		{Key: "tokenizer.ggml.eos_token_id", Value: uint32(2)},
		{Key: "tokenizer.ggml.unknown_token_id", Value: uint32(0)},
		{Key: "tokenizer.chat_template", Value: ChatML},
	}
	r := rand.New(rand.NewPCG(seed, 7))
	tensor := func(name string, scale float64, dims ...int) gguf.TensorData {
		n := 1
		ds := make([]uint64, len(dims))
		for i, d := range dims {
			n *= d
			ds[i] = uint64(d)
		}
		data := make([]byte, 4*n)
		for i := range n {
			v := float32(r.NormFloat64() * scale)
			if scale == 0 {
				v = 1
			}
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
		}
		return gguf.TensorData{Tensor: gguf.Tensor{Name: name, Dims: ds, Type: gguf.F32}, Data: data}
	}
	vocab, kvDim := len(tokens), s.embd/s.heads*s.kvHeads
	w := 1 / math.Sqrt(float64(s.embd))
	ts := []gguf.TensorData{tensor("token_embd.weight", 1, s.embd, vocab), tensor("output_norm.weight", 0, s.embd), tensor("output.weight", w, s.embd, vocab)}
	for l := range s.layers {
		p := "blk." + strconv.Itoa(l) + "."
		ts = append(ts, tensor(p+"attn_norm.weight", 0, s.embd), tensor(p+"attn_q.weight", w, s.embd, s.embd),
			tensor(p+"attn_k.weight", w, s.embd, kvDim), tensor(p+"attn_v.weight", w, s.embd, kvDim),
			tensor(p+"attn_output.weight", w, s.embd, s.embd), tensor(p+"ffn_norm.weight", 0, s.embd),
			tensor(p+"ffn_gate.weight", w, s.embd, s.ff), tensor(p+"ffn_up.weight", w, s.embd, s.ff),
			tensor(p+"ffn_down.weight", 1/math.Sqrt(float64(s.ff)), s.ff, s.embd))
	}
	path := filepath.Join(dir, "lifeline-test.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := gguf.Write(f, kvs, ts); err != nil {
		t.Fatal(err)
	}
	return path
}
