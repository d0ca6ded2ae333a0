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
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// Shape is the shape of a model WriteModel writes: its architecture
// ("llama": a SentencePiece vocabulary; "qwen2": a byte-level BPE one and
// attention biases) and sizes.
type Shape struct {
	Arch string
	// Without names a tensor left out: a file whose header is sound and
	// that llama.cpp refuses to load.
	Without string
	// Weights is the type of the matrices (F32 when zero; F16, BF16,
	// Q8_0 or Q4_0); norms stay F32, as converters write them.
	Weights gguf.TensorType
	// Llama3Rope writes Llama 3's RoPE frequency scaling (Llama3Scaling)
	// as a rope_freqs tensor.
	Llama3Rope                            bool
	embd, layers, heads, kvHeads, ff, ctx int
}

// ChatML is the chat template WriteModel gives its models (Qwen's family).
const ChatML = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

// Tiny is the shape tests use: 2 layers of 64, 4 heads over 2 KV heads.
var Tiny = Shape{Arch: "llama", embd: 64, layers: 2, heads: 4, kvHeads: 2, ff: 128, ctx: 512}

// Small is the reference engine's "small" preset's shape (8 layers of
// 384, 6 heads over 2 KV heads, 4k context): what figures are measured on.
var Small = Shape{Arch: "llama", embd: 384, layers: 8, heads: 6, kvHeads: 2, ff: 1024, ctx: 4096}

// TinyQwen2 is Tiny as a Qwen2 model.
var TinyQwen2 = Shape{Arch: "qwen2", embd: 64, layers: 2, heads: 4, kvHeads: 2, ff: 128, ctx: 512}

// byteChars is GPT-2's byte-level alphabet: each byte as a printable rune
// (printable ASCII and Latin-1 as themselves, the rest from U+0100 on).
func byteChars() [256]string {
	var out [256]string
	n := 0
	for b := range 256 {
		if (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255) {
			out[b] = string(rune(b))
		} else {
			out[b] = string(rune(256 + n))
			n++
		}
	}
	return out
}

// BPEVocab is a byte-level BPE vocabulary: the 256 byte symbols, then the
// built-in tokenizer's words (with their leading space) merged left to
// right, each merge a token; then Qwen's special tokens.
func BPEVocab() (tokens []string, types []int32, merges []string) {
	chars := byteChars()
	have := map[string]bool{}
	add := func(tok string, typ int32) {
		if !have[tok] {
			have[tok] = true
			tokens, types = append(tokens, tok), append(types, typ)
		}
	}
	for _, c := range chars {
		add(c, 1)
	}
	merged := map[string]bool{}
	b := tokenizer.NewBuiltin()
	for i := range b.VocabSize() {
		p := b.PieceString(i)
		word := strings.TrimPrefix(p, " ")
		if len(word) < 2 || strings.Trim(word, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
			continue
		}
		cur := chars[p[0]]
		for j := 1; j < len(p); j++ {
			m := cur + " " + chars[p[j]]
			if !merged[m] {
				merged[m] = true
				merges = append(merges, m)
			}
			cur += chars[p[j]]
			add(cur, 1)
		}
	}
	for _, sp := range []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"} {
		add(sp, 3)
	}
	return tokens, types, merges
}

// vocabKVs is the tokenizer metadata of arch's vocabulary.
func vocabKVs(arch string) (kvs []gguf.KV, n int) {
	if arch == "qwen2" {
		tokens, types, merges := BPEVocab()
		id := func(tok string) uint32 { return uint32(slices.Index(tokens, tok)) }
		return []gguf.KV{
			{Key: "tokenizer.ggml.model", Value: "gpt2"},
			{Key: "tokenizer.ggml.pre", Value: "qwen2"},
			{Key: "tokenizer.ggml.tokens", Value: gguf.Strings(tokens)},
			{Key: "tokenizer.ggml.token_type", Value: gguf.Int32s(types)},
			{Key: "tokenizer.ggml.merges", Value: gguf.Strings(merges)},
			{Key: "tokenizer.ggml.eos_token_id", Value: id("<|im_end|>")},
			{Key: "tokenizer.ggml.padding_token_id", Value: id("<|endoftext|>")},
			{Key: "tokenizer.ggml.bos_token_id", Value: id("<|endoftext|>")},
			{Key: "tokenizer.ggml.add_bos_token", Value: false},
		}, len(tokens)
	}
	tokens, scores, types := SPMVocab()
	return []gguf.KV{
		{Key: "tokenizer.ggml.model", Value: "llama"},
		{Key: "tokenizer.ggml.tokens", Value: gguf.Strings(tokens)},
		{Key: "tokenizer.ggml.scores", Value: gguf.Float32s(scores)},
		{Key: "tokenizer.ggml.token_type", Value: gguf.Int32s(types)},
		{Key: "tokenizer.ggml.bos_token_id", Value: uint32(1)},
		{Key: "tokenizer.ggml.eos_token_id", Value: uint32(2)},
		{Key: "tokenizer.ggml.unknown_token_id", Value: uint32(0)},
	}, len(tokens)
}

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

// WriteModel writes a GGUF of shape s (llama with a SentencePiece
// vocabulary, or qwen2 with a byte-level BPE one) with random weights
// (seed) and the ChatML template to dir, and returns its path.
func WriteModel(t testing.TB, dir string, s Shape, seed uint64) string {
	t.Helper()
	path, err := Write(dir, s, seed)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// Write is WriteModel for a benchmark: the error is returned.
func Write(dir string, s Shape, seed uint64) (string, error) {
	a := s.Arch
	if a == "" {
		a = "llama"
	}
	vocabMeta, vocab := vocabKVs(a)
	kvs := append([]gguf.KV{
		{Key: "general.architecture", Value: a},
		{Key: "general.name", Value: "lifeline-test"},
		{Key: a + ".context_length", Value: uint32(s.ctx)},
		{Key: a + ".embedding_length", Value: uint32(s.embd)},
		{Key: a + ".block_count", Value: uint32(s.layers)},
		{Key: a + ".feed_forward_length", Value: uint32(s.ff)},
		{Key: a + ".attention.head_count", Value: uint32(s.heads)},
		{Key: a + ".attention.head_count_kv", Value: uint32(s.kvHeads)},
		{Key: a + ".attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
		{Key: a + ".rope.freq_base", Value: float32(10000)},
		{Key: "tokenizer.chat_template", Value: ChatML},
	}, vocabMeta...)
	r := rand.New(rand.NewPCG(seed, 7))
	tensor := func(name string, scale float64, dims ...int) gguf.TensorData {
		n := 1
		ds := make([]uint64, len(dims))
		for i, d := range dims {
			n *= d
			ds[i] = uint64(d)
		}
		vs := make([]float32, n)
		for i := range vs {
			vs[i] = float32(r.NormFloat64() * scale)
			if scale == 0 {
				vs[i] = 1
			}
		}
		typ := gguf.F32
		if len(dims) == 2 {
			typ = s.Weights
		}
		return gguf.TensorData{Tensor: gguf.Tensor{Name: name, Dims: ds, Type: typ}, Data: encode(typ, vs)}
	}
	kvDim := s.embd / s.heads * s.kvHeads
	w := 1 / math.Sqrt(float64(s.embd))
	ts := []gguf.TensorData{tensor("token_embd.weight", 1, s.embd, vocab), tensor("output_norm.weight", 0, s.embd), tensor("output.weight", w, s.embd, vocab)}
	for l := range s.layers {
		p := "blk." + strconv.Itoa(l) + "."
		ts = append(ts, tensor(p+"attn_norm.weight", 0, s.embd), tensor(p+"attn_q.weight", w, s.embd, s.embd),
			tensor(p+"attn_k.weight", w, s.embd, kvDim), tensor(p+"attn_v.weight", w, s.embd, kvDim),
			tensor(p+"attn_output.weight", w, s.embd, s.embd), tensor(p+"ffn_norm.weight", 0, s.embd),
			tensor(p+"ffn_gate.weight", w, s.embd, s.ff), tensor(p+"ffn_up.weight", w, s.embd, s.ff),
			tensor(p+"ffn_down.weight", 1/math.Sqrt(float64(s.ff)), s.ff, s.embd))
		if a == "qwen2" {
			ts = append(ts, tensor(p+"attn_q.bias", 0.1, s.embd), tensor(p+"attn_k.bias", 0.1, kvDim), tensor(p+"attn_v.bias", 0.1, kvDim))
		}
	}
	if s.Llama3Rope {
		f := Llama3Scaling.Factors(s.embd / s.heads)
		ts = append(ts, gguf.TensorData{Tensor: gguf.Tensor{Name: "rope_freqs.weight", Dims: []uint64{uint64(len(f))}, Type: gguf.F32}, Data: encode(gguf.F32, f)})
	}
	ts = slices.DeleteFunc(ts, func(d gguf.TensorData) bool { return d.Name == s.Without })
	path := filepath.Join(dir, "lifeline-test-"+a+".gguf")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := gguf.Write(f, kvs, ts); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}

// encode is vs in ggml's layout of type t: F32, F16 or Q8_0 (blocks of
// 32: an F16 scale, then 32 int8s).
func encode(t gguf.TensorType, vs []float32) []byte {
	switch t {
	case gguf.F16:
		out := make([]byte, 2*len(vs))
		for i, v := range vs {
			binary.LittleEndian.PutUint16(out[2*i:], half(v))
		}
		return out
	case gguf.BF16:
		out := make([]byte, 2*len(vs))
		for i, v := range vs {
			b := math.Float32bits(v)
			b += 0x7fff + (b>>16)&1 // round to nearest even
			binary.LittleEndian.PutUint16(out[2*i:], uint16(b>>16))
		}
		return out
	case gguf.Q4_0:
		out := make([]byte, 0, len(vs)/32*18)
		for b := 0; b+32 <= len(vs); b += 32 {
			amax, m := float32(0), float32(0)
			for _, v := range vs[b : b+32] {
				if a := float32(math.Abs(float64(v))); a > amax {
					amax, m = a, v
				}
			}
			d := m / -8
			out = binary.LittleEndian.AppendUint16(out, half(d))
			q := func(v float32) byte {
				if d == 0 {
					return 8
				}
				return byte(min(15, max(0, int(math.Round(float64(v/d)))+8)))
			}
			for j := range 16 {
				out = append(out, q(vs[b+j])|q(vs[b+16+j])<<4)
			}
		}
		return out
	case gguf.Q8_0:
		out := make([]byte, 0, len(vs)/32*34)
		for b := 0; b+32 <= len(vs); b += 32 {
			amax := float32(0)
			for _, v := range vs[b : b+32] {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			d := amax / 127
			out = binary.LittleEndian.AppendUint16(out, half(d))
			for _, v := range vs[b : b+32] {
				q := int8(0)
				if d != 0 {
					q = int8(math.Round(float64(v / d)))
				}
				out = append(out, byte(q))
			}
		}
		return out
	}
	out := make([]byte, 4*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
	return out
}

// half is v as an IEEE half (rounded to nearest even; no subnormals
// needed for weights of this size, flushed to zero).
func half(v float32) uint16 {
	b := math.Float32bits(v)
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case exp <= 0:
		return sign
	case exp >= 31:
		return sign | 0x7c00
	}
	h := uint32(exp)<<10 | mant>>13
	if rest := mant & 0x1fff; rest > 0x1000 || rest == 0x1000 && h&1 == 1 {
		h++ // may carry into the exponent: still the nearest half
	}
	return sign | uint16(h)
}

// ShapeOf is a model shape of the given sizes, matrices of type weights.
func ShapeOf(arch string, embd, layers, heads, kvHeads, ff, ctx int, weights gguf.TensorType) Shape {
	return Shape{Arch: arch, Weights: weights, embd: embd, layers: layers, heads: heads, kvHeads: kvHeads, ff: ff, ctx: ctx}
}

// RopeScaling is config.json's rope_scaling of type llama3.
type RopeScaling struct {
	Factor, Low, High, OriginalMax float64
}

// Llama3Scaling is the scaling the test models get: Llama 3.1's factors
// over an original context of 64 positions, so that the bands differ
// within a test's contexts.
var Llama3Scaling = RopeScaling{Factor: 8, Low: 1, High: 4, OriginalMax: 64}

// Factors are the rope_freqs values of s for heads of headSize.
func (s RopeScaling) Factors(headSize int) []float32 {
	return model.Llama3RopeFactors(10000, headSize, s.Factor, s.Low, s.High, s.OriginalMax)
}

// JSON is s as config.json writes it.
func (s RopeScaling) JSON() map[string]any {
	return map[string]any{"rope_type": "llama3", "factor": s.Factor, "low_freq_factor": s.Low, "high_freq_factor": s.High,
		"original_max_position_embeddings": s.OriginalMax}
}
