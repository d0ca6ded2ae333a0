package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// hfTokenizer is what tokenizer.json says that the vocabulary is built
// from.
type hfTokenizer struct {
	AddedTokens []struct {
		ID      int    `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         struct {
		Type         string          `json:"type"`
		Vocab        map[string]int  `json:"vocab"`
		Merges       json.RawMessage `json:"merges"`
		ByteFallback bool            `json:"byte_fallback"`
	} `json:"model"`
}

// hfConfig is what tokenizer_config.json and generation_config.json
// say about special tokens.
type hfConfig struct {
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	AddBOS       *bool           `json:"add_bos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
	EOSID        json.RawMessage `json:"eos_token_id"`
	BOSID        json.RawMessage `json:"bos_token_id"`
}

// FromHF is the vocabulary of a Hugging Face model directory: byte-level
// BPE from tokenizer.json (Llama 3, Qwen2), or SentencePiece from
// tokenizer.model (Llama 2, Mistral); special tokens from
// tokenizer_config.json and generation_config.json, as llama.cpp's
// converter would write them into a GGUF.
func FromHF(dir string) (*Vocab, error) {
	var cfg, gen hfConfig
	if err := readJSON(filepath.Join(dir, "tokenizer_config.json"), &cfg, false); err != nil {
		return nil, err
	}
	if err := readJSON(filepath.Join(dir, "generation_config.json"), &gen, false); err != nil {
		return nil, err
	}
	var tj hfTokenizer
	haveJSON := true
	if err := readJSON(filepath.Join(dir, "tokenizer.json"), &tj, true); errors.Is(err, fs.ErrNotExist) {
		haveJSON = false
	} else if err != nil {
		return nil, err
	}
	var s Spec
	var err error
	switch {
	case haveJSON && tj.Model.Type == "BPE" && !tj.Model.ByteFallback:
		s, err = byteLevelSpec(tj)
	default:
		s, err = sentencePieceSpec(dir, tj)
	}
	if err != nil {
		return nil, err
	}
	ids := func(raw json.RawMessage) []int { return hfTokenIDs(raw, s.Tokens) }
	if b := slices.Concat(ids(cfg.BOS), ids(gen.BOSID)); len(b) > 0 {
		s.BOS = b[0]
	}
	if e := slices.Concat(ids(gen.EOSID), ids(cfg.EOS)); len(e) > 0 {
		s.EOS = e[0]
		if len(e) > 1 {
			s.EOT = e[1] // Llama 3: <|end_of_text|>, then <|eot_id|>
		}
	}
	if cfg.AddBOS != nil {
		s.AddBOS = *cfg.AddBOS
	}
	var model struct {
		VocabSize int `json:"vocab_size"`
	}
	if err := readJSON(filepath.Join(dir, "config.json"), &model, false); err != nil {
		return nil, err
	}
	// The embedding may have rows past the last token (Qwen2.5: 151,936
	// for 151,665): llama.cpp's converter pads the vocabulary to them.
	for i := len(s.Tokens); i < min(model.VocabSize, maxTokens); i++ {
		s.Tokens, s.Types = append(s.Tokens, fmt.Sprintf("[PAD%d]", i)), append(s.Types, TypeUnused)
		if s.Scores != nil {
			s.Scores = append(s.Scores, -1000)
		}
	}
	return NewVocab(s)
}

// ChatTemplateHF is the chat template of a Hugging Face model directory
// (tokenizer_config.json's chat_template; "" when none).
func ChatTemplateHF(dir string) string {
	var cfg hfConfig
	if readJSON(filepath.Join(dir, "tokenizer_config.json"), &cfg, false) != nil {
		return ""
	}
	var s string
	if json.Unmarshal(cfg.ChatTemplate, &s) == nil {
		return s
	}
	var named []struct{ Name, Template string } // several templates: the default one
	if json.Unmarshal(cfg.ChatTemplate, &named) == nil {
		for _, t := range named {
			if t.Name == "default" {
				return t.Template
			}
		}
	}
	return ""
}

func readJSON(path string, v any, required bool) error {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !required {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnsupportedVocab, err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrUnsupportedVocab, path, err)
	}
	return nil
}

// hfTokenIDs reads a special token as tokenizer_config.json or
// generation_config.json gives it: an id, a list of ids, a token's text,
// or {"content": text}.
func hfTokenIDs(raw json.RawMessage, tokens []string) []int {
	var id int
	var list []int
	var text string
	var obj struct{ Content string }
	switch {
	case len(raw) == 0 || string(raw) == "null":
	case json.Unmarshal(raw, &id) == nil:
		return []int{id}
	case json.Unmarshal(raw, &list) == nil:
		return list
	case json.Unmarshal(raw, &text) == nil:
		if i := slices.Index(tokens, text); i >= 0 {
			return []int{i}
		}
	case json.Unmarshal(raw, &obj) == nil:
		if i := slices.Index(tokens, obj.Content); i >= 0 {
			return []int{i}
		}
	}
	return nil
}

// hfPreTokenizers are the Split patterns of tokenizer.json by the
// pre-tokenizer name llama.cpp's converter gives them.
var hfPreTokenizers = map[string]string{
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`: "llama-bpe",
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`:      "qwen2",
}

// byteLevelSpec is a byte-level BPE tokenizer.json as GGUF keys.
func byteLevelSpec(tj hfTokenizer) (Spec, error) {
	s := Spec{Model: "gpt2", BOS: -1, EOS: -1, EOT: -1, Unknown: -1}
	var pre struct {
		Type          string
		UseRegex      bool `json:"use_regex"`
		Pretokenizers []struct {
			Type     string
			UseRegex bool `json:"use_regex"`
			Pattern  struct{ Regex string }
		}
	}
	if err := json.Unmarshal(tj.PreTokenizer, &pre); err != nil {
		return s, fmt.Errorf("%w: tokenizer.json pre_tokenizer: %v", ErrUnsupportedVocab, err)
	}
	switch {
	case pre.Type == "ByteLevel" && pre.UseRegex:
		s.Pre = "gpt-2"
	case pre.Type == "Sequence" && len(pre.Pretokenizers) == 2 && pre.Pretokenizers[0].Type == "Split" &&
		pre.Pretokenizers[1].Type == "ByteLevel" && !pre.Pretokenizers[1].UseRegex:
		name, ok := hfPreTokenizers[pre.Pretokenizers[0].Pattern.Regex]
		if !ok {
			return s, fmt.Errorf("%w: tokenizer.json splits on %q, a pre-tokenizer Lifeline's engine does not know (engine: llamacpp on a converted GGUF may)", ErrUnsupportedVocab, pre.Pretokenizers[0].Pattern.Regex)
		}
		s.Pre = name
	default:
		return s, fmt.Errorf("%w: tokenizer.json pre_tokenizer %s is not a byte-level one Lifeline's engine knows", ErrUnsupportedVocab, string(tj.PreTokenizer))
	}
	if p := preTokenizers[s.Pre]; p.addBOSDefault {
		s.AddBOS = true
	}
	n := len(tj.Model.Vocab)
	for _, a := range tj.AddedTokens {
		if a.ID < 0 || a.ID >= maxTokens {
			return s, fmt.Errorf("%w: added token %q has id %d (0..%d)", ErrUnsupportedVocab, a.Content, a.ID, maxTokens-1)
		}
		n = max(n, a.ID+1)
	}
	s.Tokens, s.Types = make([]string, n), make([]int32, n)
	for i := range s.Tokens {
		s.Tokens[i], s.Types[i] = fmt.Sprintf("[PAD%d]", i), TypeUnused // llama.cpp's converter fills holes so
	}
	for tok, id := range tj.Model.Vocab {
		if id < 0 || id >= n {
			return s, fmt.Errorf("%w: token %q has id %d", ErrUnsupportedVocab, tok, id)
		}
		s.Tokens[id], s.Types[id] = tok, TypeNormal
	}
	for _, a := range tj.AddedTokens {
		s.Tokens[a.ID], s.Types[a.ID] = a.Content, addedType(a.Content, a.Special)
		if s.Types[a.ID] == TypeUserDefined {
			s.Tokens[a.ID] = strings.ReplaceAll(a.Content, "▁", " ") // as the converter writes it
		}
	}
	var err error
	s.Merges, err = hfMerges(tj.Model.Merges)
	return s, err
}

// addedType is an added token's type as llama.cpp's converter gives it:
// control when tokenizer.json says special or when it looks special
// ("<|…|>", "<｜…｜>", "<unused…>", "<pad>", "<mask>"), else user-defined.
func addedType(text string, special bool) int32 {
	looks := slices.Contains([]string{"<pad>", "<mask>", "<2mass>", "[@BOS@]"}, text) ||
		strings.HasPrefix(text, "<|") && strings.HasSuffix(text, "|>") ||
		strings.HasPrefix(text, "<｜") && strings.HasSuffix(text, "｜>") ||
		strings.HasPrefix(text, "<unused") && strings.HasSuffix(text, ">")
	if special || looks {
		return TypeControl
	}
	return TypeUserDefined
}

// hfMerges reads merges as "a b" strings or as ["a", "b"] pairs.
func hfMerges(raw json.RawMessage) ([]string, error) {
	var strs []string
	if json.Unmarshal(raw, &strs) == nil {
		return strs, nil
	}
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json merges: %v", ErrUnsupportedVocab, err)
	}
	out := make([]string, len(pairs))
	for i, p := range pairs {
		out[i] = p[0] + " " + p[1]
	}
	return out, nil
}

// sentencePieceSpec is tokenizer.model (SentencePiece's ModelProto: the
// pieces with their scores and types, and whether a space is prefixed)
// with tokenizer.json's added tokens, as GGUF keys.
func sentencePieceSpec(dir string, tj hfTokenizer) (Spec, error) {
	s := Spec{Model: "llama", BOS: -1, EOS: -1, EOT: -1, Unknown: -1, AddBOS: true, AddSpacePrefix: true}
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.model"))
	if err != nil {
		return s, fmt.Errorf("%w: neither a byte-level tokenizer.json nor a SentencePiece tokenizer.model: %v", ErrUnsupportedVocab, err)
	}
	bpe := false
	err = protoFields(raw, func(f protoField) error {
		switch f.num {
		case 1: // SentencePiece
			piece, score, typ := "", float32(0), int32(TypeNormal)
			err := protoFields(f.bytes, func(g protoField) error {
				switch g.num {
				case 1:
					piece = string(g.bytes)
				case 2:
					score = math.Float32frombits(uint32(g.u))
				case 3:
					typ = int32(g.u)
				}
				return nil
			})
			switch {
			case typ < TypeNormal || typ > TypeByte:
				return fmt.Errorf("piece %d (%q) has type %d", len(s.Tokens), piece, typ)
			case len(s.Tokens) >= maxTokens:
				return fmt.Errorf("over %d pieces", maxTokens)
			case typ == TypeUserDefined:
				typ = TypeNormal // the converter writes user-defined pieces as normal ones
			}
			s.Tokens, s.Scores, s.Types = append(s.Tokens, piece), append(s.Scores, score), append(s.Types, typ)
			return err
		case 2: // TrainerSpec: model_type 2 is BPE
			return protoFields(f.bytes, func(g protoField) error {
				if g.num == 3 {
					bpe = g.u == 2
				}
				return nil
			})
		case 3: // NormalizerSpec: add_dummy_prefix
			return protoFields(f.bytes, func(g protoField) error {
				if g.num == 3 {
					s.AddSpacePrefix = g.u != 0
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return s, fmt.Errorf("%w: tokenizer.model: %v", ErrUnsupportedVocab, err)
	}
	if !bpe {
		return s, fmt.Errorf("%w: tokenizer.model is not a BPE SentencePiece model (a unigram one is llama.cpp's \"t5\" vocabulary: engine: llamacpp)", ErrUnsupportedVocab)
	}
	for i, t := range s.Types {
		if t == TypeUnknown && s.Unknown < 0 {
			s.Unknown = i
		}
	}
	for _, a := range tj.AddedTokens {
		if a.ID < 0 || a.ID >= maxTokens {
			return s, fmt.Errorf("%w: added token %q has id %d (0..%d)", ErrUnsupportedVocab, a.Content, a.ID, maxTokens-1)
		}
		if a.ID >= len(s.Tokens) {
			for len(s.Tokens) <= a.ID {
				s.Tokens, s.Scores, s.Types = append(s.Tokens, fmt.Sprintf("[PAD%d]", len(s.Tokens))), append(s.Scores, -1000), append(s.Types, TypeUnused)
			}
		}
		if s.Types[a.ID] != TypeControl {
			s.Tokens[a.ID], s.Types[a.ID], s.Scores[a.ID] = a.Content, addedType(a.Content, a.Special), -1000
		}
	}
	return s, nil
}

// protoField is one field of a protobuf message: a length-delimited
// one's bytes, a varint's or a fixed32's value.
type protoField struct {
	num   protowire.Number
	bytes []byte
	u     uint64
}

// protoFields calls each for every field of a protobuf message.
func protoFields(b []byte, each func(protoField) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		f := protoField{num: num}
		switch typ {
		case protowire.BytesType:
			f.bytes, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			f.u, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var x uint32
			x, n = protowire.ConsumeFixed32(b)
			f.u = uint64(x)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := each(f); err != nil {
			return err
		}
	}
	return nil
}
