package llamacpptest

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protowire"
)

// Llama3Split is Llama 3's pre-tokenizer pattern as its tokenizer.json
// writes it; Qwen2Split is Qwen2's.
const (
	Llama3Split = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	Qwen2Split  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// HFTokenizer is a vocabulary as a Hugging Face directory states it.
type HFTokenizer struct {
	// Byte-level BPE (tokenizer.json): Tokens, Types (3: an added
	// special token, 4: an added one), Merges, Split (the pre-tokenizer
	// pattern). SentencePiece (tokenizer.model): Tokens, Scores, Types.
	Tokens   []string
	Types    []int32
	Scores   []float32
	Merges   []string
	Split    string
	BOS, EOS string
	// AddBOS, when set, is tokenizer_config.json's add_bos_token.
	AddBOS *bool
	// NoSpacePrefix turns SentencePiece's add_dummy_prefix off.
	NoSpacePrefix bool
	ChatTemplate  string
}

// WriteHFTokenizer writes t's files into dir: tokenizer.json (byte-level
// BPE) or tokenizer.model (SentencePiece), and tokenizer_config.json.
func WriteHFTokenizer(dir string, t HFTokenizer) error {
	cfg := map[string]any{"bos_token": t.BOS, "eos_token": t.EOS, "chat_template": t.ChatTemplate}
	if t.AddBOS != nil {
		cfg["add_bos_token"] = *t.AddBOS
	}
	if err := writeJSON(filepath.Join(dir, "tokenizer_config.json"), cfg); err != nil {
		return err
	}
	if t.Merges == nil {
		return os.WriteFile(filepath.Join(dir, "tokenizer.model"), sentencePieceModel(t), 0o644)
	}
	vocab := map[string]int{}
	var added []map[string]any
	for id, tok := range t.Tokens {
		if t.Types[id] == 3 || t.Types[id] == 4 {
			added = append(added, map[string]any{"id": id, "content": tok, "special": t.Types[id] == 3})
			continue
		}
		vocab[tok] = id
	}
	return writeJSON(filepath.Join(dir, "tokenizer.json"), map[string]any{
		"added_tokens": added,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]string{"Regex": t.Split}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}}},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": t.Merges, "byte_fallback": false},
	})
}

// sentencePieceModel is SentencePiece's ModelProto of t: its pieces,
// a BPE trainer spec and the normalizer's add_dummy_prefix.
func sentencePieceModel(t HFTokenizer) []byte {
	var b []byte
	for i, p := range t.Tokens {
		var piece []byte
		piece = protowire.AppendTag(piece, 1, protowire.BytesType)
		piece = protowire.AppendString(piece, p)
		piece = protowire.AppendTag(piece, 2, protowire.Fixed32Type)
		piece = protowire.AppendFixed32(piece, math.Float32bits(t.Scores[i]))
		piece = protowire.AppendTag(piece, 3, protowire.VarintType)
		piece = protowire.AppendVarint(piece, uint64(t.Types[i]))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, piece)
	}
	trainer := protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), 2) // model_type BPE
	b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), trainer)
	prefix := uint64(1)
	if t.NoSpacePrefix {
		prefix = 0
	}
	norm := protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), prefix)
	return protowire.AppendBytes(protowire.AppendTag(b, 3, protowire.BytesType), norm)
}

func writeJSON(path string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}

// HFTokenizerOf is the test vocabulary of arch ("llama": SentencePiece;
// "qwen2": byte-level BPE) as Hugging Face files state it, with the
// ChatML template.
func HFTokenizerOf(arch string) HFTokenizer {
	if arch == "qwen2" {
		tokens, types, merges := BPEVocab()
		f := false
		return HFTokenizer{Tokens: tokens, Types: types, Merges: merges, Split: Qwen2Split, BOS: "<|endoftext|>", EOS: "<|im_end|>", AddBOS: &f, ChatTemplate: ChatML}
	}
	tokens, scores, types := SPMVocab()
	return HFTokenizer{Tokens: tokens, Types: types, Scores: scores, BOS: "<s>", EOS: "</s>", ChatTemplate: ChatML}
}
