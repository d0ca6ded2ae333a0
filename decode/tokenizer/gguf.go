package tokenizer

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/lifeline-llm/lifeline/decode/gguf"
)

// FromGGUF is the vocabulary of a GGUF file's tokenizer.ggml.* keys, with
// llama.cpp's defaults where a key is absent.
func FromGGUF(f *gguf.File) (*Vocab, error) {
	s := Spec{BOS: -1, EOS: -1, EOT: -1, Unknown: -1}
	s.Model, _ = f.String("tokenizer.ggml.model")
	s.Pre, _ = f.String("tokenizer.ggml.pre")
	var err error
	if s.Tokens, err = ggufArray[string](f, "tokenizer.ggml.tokens", true); err != nil {
		return nil, err
	}
	if s.Types, err = ggufArray[int32](f, "tokenizer.ggml.token_type", false); err != nil {
		return nil, err
	}
	if s.Scores, err = ggufArray[float32](f, "tokenizer.ggml.scores", false); err != nil {
		return nil, err
	}
	if s.Merges, err = ggufArray[string](f, "tokenizer.ggml.merges", false); err != nil {
		return nil, err
	}
	switch s.Model {
	case "llama":
		s.BOS, s.EOS, s.Unknown, s.AddBOS, s.AddSpacePrefix = 1, 2, 0, true, true
	case "gpt2":
		s.BOS, s.EOS = 11, 11 // llama.cpp's defaults, as odd as they look
		if s.Merges == nil {
			return nil, fmt.Errorf("%w: a byte-level BPE vocabulary without tokenizer.ggml.merges", ErrUnsupportedVocab)
		}
		if p, ok := preTokenizers[s.Pre]; ok {
			s.AddBOS = p.addBOSDefault
		}
	}
	for key, dst := range map[string]*int{"bos": &s.BOS, "eos": &s.EOS, "eot": &s.EOT, "unknown": &s.Unknown} {
		if id, ok := f.Uint("tokenizer.ggml." + key + "_token_id"); ok {
			*dst = int(min(id, 1<<31))
		}
		if *dst >= len(s.Tokens) {
			*dst = -1
		}
	}
	for key, dst := range map[string]*bool{"add_bos_token": &s.AddBOS, "add_space_prefix": &s.AddSpacePrefix} {
		if b, ok := f.Get("tokenizer.ggml." + key); ok {
			if bv, isBool := b.(bool); isBool {
				*dst = bv
			}
		}
	}
	return NewVocab(s)
}

// ggufArray is key's array of T (nil when absent and not required).
func ggufArray[T any](f *gguf.File, key string, required bool) ([]T, error) {
	v, ok := f.Get(key)
	if !ok {
		if required {
			return nil, fmt.Errorf("%w: no %s", ErrUnsupportedVocab, key)
		}
		return nil, nil
	}
	a, isArr := v.(gguf.Array)
	if !isArr {
		return nil, fmt.Errorf("%w: %s is a %T, not an array", ErrUnsupportedVocab, key, v)
	}
	out := make([]T, len(a.Values))
	for i, x := range a.Values {
		t, isT := x.(T)
		if !isT {
			var zero T
			return nil, fmt.Errorf("%w: %s[%d] is a %T, not a %T", ErrUnsupportedVocab, key, i, x, zero)
		}
		out[i] = t
	}
	return out, nil
}

// GGUF is the vocabulary as GGUF's tokenizer.ggml.* metadata, as
// llama.cpp's converter writes it: what FromGGUF reads back.
func (v *Vocab) GGUF() []gguf.KV {
	s := v.spec
	kvs := []gguf.KV{{Key: "tokenizer.ggml.model", Value: s.Model}, {Key: "tokenizer.ggml.tokens", Value: gguf.Strings(s.Tokens)},
		{Key: "tokenizer.ggml.token_type", Value: gguf.Int32s(v.types)}, {Key: "tokenizer.ggml.add_bos_token", Value: s.AddBOS}}
	if s.Model == "gpt2" {
		kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.pre", Value: cmp.Or(s.Pre, "default")}, gguf.KV{Key: "tokenizer.ggml.merges", Value: gguf.Strings(s.Merges)})
	} else {
		kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.scores", Value: gguf.Float32s(s.Scores)}, gguf.KV{Key: "tokenizer.ggml.add_space_prefix", Value: s.AddSpacePrefix})
	}
	for key, id := range map[string]int{"bos": s.BOS, "eos": s.EOS, "eot": s.EOT, "unknown": s.Unknown} {
		if id >= 0 {
			kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml." + key + "_token_id", Value: uint32(id)})
		}
	}
	slices.SortFunc(kvs, func(a, b gguf.KV) int { return cmp.Compare(a.Key, b.Key) })
	return kvs
}
