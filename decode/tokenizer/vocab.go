package tokenizer

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// ErrUnsupportedVocab is wrapped by every refusal of a model's vocabulary:
// a tokenizer model or pre-tokenizer this package does not implement, or
// a vocabulary that contradicts itself.
var ErrUnsupportedVocab = errors.New("tokenizer: unsupported vocabulary")

// Token types, as GGUF's tokenizer.ggml.token_type numbers them.
const (
	TypeNormal      = 1
	TypeUnknown     = 2
	TypeControl     = 3
	TypeUserDefined = 4
	TypeUnused      = 5
	TypeByte        = 6
)

// Spec is a model's vocabulary as its file states it: GGUF's
// tokenizer.ggml.* keys, or a Hugging Face tokenizer.json translated to
// them.
type Spec struct {
	// Model is "llama" (SentencePiece: scores, "▁" for a space, "<0xXX>"
	// byte tokens) or "gpt2" (byte-level BPE: merges, a pre-tokenizer).
	Model string
	// Pre names the BPE pre-tokenizer ("llama-bpe", "qwen2", "default").
	Pre    string
	Tokens []string
	Types  []int32 // nil: all normal
	Scores []float32
	Merges []string // "left right", lowest rank first
	// BOS, EOS, EOT and Unknown are token ids (-1: none); AddBOS says
	// whether a prompt starts with BOS; AddSpacePrefix (SentencePiece)
	// whether the first piece of text gets a leading space.
	BOS, EOS, EOT, Unknown int
	AddBOS, AddSpacePrefix bool
}

// Vocab is a SentencePiece or byte-level BPE vocabulary that encodes as
// llama.cpp does the same file: the same special-token partition, merges,
// pre-tokenizer and byte fallback, checked token for token against it.
type Vocab struct {
	spm       bool
	tokens    []string
	types     []int32
	scores    []float32
	ids       map[string]int
	ranks     map[string]int
	pre       []*regexp2.Regexp
	ignoreMrg bool
	spacePfx  bool
	addBOS    bool
	bos, eos  int
	unk       int
	byteTok   [256]int
	eog       []int
	specials  []int // partitioned out of text, longest first
	pieces    [][]byte
	hash      string
	spec      Spec
}

// Bounds on a vocabulary: real ones have tokens of a few hundred bytes
// at most, and spell a few MB in all.
const (
	maxTokens     = 1 << 22
	maxTokenBytes = 4096
	maxPieceBytes = 64 << 20
)

// NewVocab builds the vocabulary s states.
func NewVocab(s Spec) (*Vocab, error) {
	n := len(s.Tokens)
	if n == 0 || n > maxTokens {
		return nil, fmt.Errorf("%w: %d tokens", ErrUnsupportedVocab, n)
	}
	v := &Vocab{spec: s, tokens: s.Tokens, types: s.Types, scores: s.Scores, ids: make(map[string]int, n),
		spacePfx: s.AddSpacePrefix, addBOS: s.AddBOS, bos: s.BOS, eos: s.EOS, unk: s.Unknown}
	if v.types == nil {
		v.types = make([]int32, n)
		for i := range v.types {
			v.types[i] = TypeNormal
		}
	}
	if len(v.types) != n {
		return nil, fmt.Errorf("%w: %d token types for %d tokens", ErrUnsupportedVocab, len(v.types), n)
	}
	for _, id := range []int{s.BOS, s.EOS, s.EOT, s.Unknown} {
		if id < -1 || id >= n {
			return nil, fmt.Errorf("%w: special token id %d outside the %d tokens", ErrUnsupportedVocab, id, n)
		}
	}
	for i, t := range s.Tokens {
		v.ids[t] = i // the last of duplicates, as llama.cpp
	}
	switch s.Model {
	case "llama":
		v.spm = true
		if len(v.scores) != n {
			return nil, fmt.Errorf("%w: %d scores for %d SentencePiece tokens", ErrUnsupportedVocab, len(v.scores), n)
		}
		v.spmByteTokens()
	case "gpt2":
		if err := v.initBPE(s); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: tokenizer model %q (Lifeline's engine reads \"llama\" and \"gpt2\"; engine: llamacpp reads the rest)", ErrUnsupportedVocab, s.Model)
	}
	v.markEndOfGeneration(s.EOT)
	for id, typ := range v.types {
		if (typ == TypeControl || typ == TypeUserDefined || typ == TypeUnknown) && v.tokens[id] != "" {
			v.specials = append(v.specials, id)
		}
	}
	slices.SortStableFunc(v.specials, func(a, b int) int { return cmp.Compare(len(v.tokens[b]), len(v.tokens[a])) })
	v.pieces = make([][]byte, n)
	total := 0
	for id := range v.pieces {
		if len(v.tokens[id]) > maxTokenBytes {
			return nil, fmt.Errorf("%w: token %d is %d bytes long (at most %d)", ErrUnsupportedVocab, id, len(v.tokens[id]), maxTokenBytes)
		}
		v.pieces[id] = v.piece(id)
		if total += len(v.pieces[id]); total > maxPieceBytes {
			return nil, fmt.Errorf("%w: the tokens spell over %d bytes", ErrUnsupportedVocab, maxPieceBytes)
		}
	}
	v.hash = v.computeHash(s)
	return v, nil
}

// eogNames are the end-of-turn tokens llama.cpp recognises by their text,
// fimEOGNames its fill-in-the-middle padding, repository and file
// separators, which end generation too; fimNames are the other
// fill-in-the-middle tokens. It types them all as control tokens
// whatever the file says.
var (
	eogNames = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
		"<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"}
	fimEOGNames = []string{"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
		"<REPO>", "<reponame>", "<|file_sep|>"}
	fimNames = []string{"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
		"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
		"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>"}
)

func (v *Vocab) markEndOfGeneration(eot int) {
	for _, name := range fimNames {
		if id, ok := v.ids[name]; ok {
			v.types[id] = TypeControl
		}
	}
	for _, name := range slices.Concat(eogNames, fimEOGNames) {
		if id, ok := v.ids[name]; ok {
			v.types[id] = TypeControl
			v.eog = append(v.eog, id)
		}
	}
	if id, ok := v.ids["<｜end▁of▁sentence｜>"]; ok && eot < 0 { // DeepSeek's, found as llama.cpp finds an EOT
		eot = id
		v.types[id] = TypeControl
	}
	for _, id := range []int{v.eos, eot} {
		if id >= 0 {
			v.eog = append(v.eog, id)
		}
	}
	slices.Sort(v.eog)
	v.eog = slices.Compact(v.eog)
}

// Encode is text's tokens without BOS; special tokens written in text
// ("<|im_start|>") are themselves, as llama.cpp's server encodes a prompt.
func (v *Vocab) Encode(text string) ([]int, error) {
	if !utf8.ValidString(text) {
		return nil, ErrInvalidUTF8
	}
	var out []int
	prevSpecial := true
	for _, f := range v.partition(text) {
		if f.id >= 0 {
			out = append(out, f.id)
			prevSpecial = true
			continue
		}
		if v.spm {
			t := f.text
			if v.spacePfx && prevSpecial {
				t = " " + t
			}
			out = v.encodeSPM(strings.ReplaceAll(t, " ", "▁"), out)
		} else {
			out = v.encodeBPE(f.text, out)
		}
		prevSpecial = false
	}
	return out, nil
}

// fragment is a special token (id ≥ 0) or text still to encode.
type fragment struct {
	id   int
	text string
}

// partition splits text at the special tokens, longest tokens first, each
// at its leftmost occurrences.
func (v *Vocab) partition(text string) []fragment {
	if text == "" {
		return nil
	}
	frags := []fragment{{id: -1, text: text}}
	for _, sp := range v.specials {
		tok := v.tokens[sp]
		var next []fragment
		for _, f := range frags {
			for f.id < 0 {
				i := strings.Index(f.text, tok)
				if i < 0 {
					break
				}
				if i > 0 {
					next = append(next, fragment{id: -1, text: f.text[:i]})
				}
				next = append(next, fragment{id: sp})
				f.text = f.text[i+len(tok):]
				if f.text == "" {
					break
				}
			}
			if f.id >= 0 || f.text != "" {
				next = append(next, f)
			}
		}
		frags = next
	}
	return frags
}

// piece is what id spells in a stream (llama.cpp's token_to_piece without
// special tokens): nothing for control and unknown tokens.
func (v *Vocab) piece(id int) []byte {
	text := v.tokens[id]
	switch v.types[id] {
	case TypeControl, TypeUnknown:
		return nil
	case TypeUserDefined:
		return []byte(text)
	case TypeByte:
		if v.spm {
			if b, ok := parseByteToken(text); ok {
				return []byte{b}
			}
		}
		return nil
	case TypeNormal:
		if v.spm {
			return []byte(strings.ReplaceAll(text, "▁", " "))
		}
		return decodeByteLevel(text)
	}
	return nil
}

// parseByteToken reads "<0xXX>".
func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || t[:3] != "<0x" || t[5] != '>' {
		return 0, false
	}
	var b byte
	for _, c := range t[3:5] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = byte(c - '0')
		case c >= 'A' && c <= 'F':
			d = byte(c-'A') + 10
		case c >= 'a' && c <= 'f':
			d = byte(c-'a') + 10
		default:
			return 0, false
		}
		b = b<<4 | d
	}
	return b, true
}

// Piece is the bytes token id stands for; prev does not change it.
func (v *Vocab) Piece(_, id int) []byte {
	if id < 0 || id >= len(v.pieces) {
		return nil
	}
	return v.pieces[id]
}

func (v *Vocab) VocabSize() int { return len(v.tokens) }
func (v *Vocab) BOS() int       { return v.bos }
func (v *Vocab) EOS() int       { return v.eos }
func (v *Vocab) Hash() string   { return v.hash }

// AddBOS says whether a prompt starts with BOS.
func (v *Vocab) AddBOS() bool { return v.addBOS && v.bos >= 0 }

// EndOfGeneration is every token that ends generation: EOS, EOT and the
// end-of-turn tokens llama.cpp knows by name.
func (v *Vocab) EndOfGeneration() []int { return v.eog }

// IsSpecial says whether id is a control, unknown or user-defined token.
func (v *Vocab) IsSpecial(id int) bool {
	if id < 0 || id >= len(v.types) {
		return false
	}
	t := v.types[id]
	return t == TypeControl || t == TypeUnknown || t == TypeUserDefined
}

// computeHash identifies the vocabulary and how it encodes.
func (v *Vocab) computeHash(s Spec) string {
	h := sha256.New()
	fmt.Fprintf(h, "model=%s;pre=%s;bos=%d;eos=%d;eot=%d;unk=%d;add_bos=%t;space=%t;", s.Model, s.Pre, s.BOS, s.EOS, s.EOT, s.Unknown, s.AddBOS, s.AddSpacePrefix)
	var b [12]byte
	for id, t := range v.tokens {
		var score float32
		if v.scores != nil {
			score = v.scores[id]
		}
		binary.LittleEndian.PutUint32(b[:4], uint32(len(t)))
		binary.LittleEndian.PutUint32(b[4:8], math.Float32bits(score))
		binary.LittleEndian.PutUint32(b[8:], uint32(v.types[id]))
		h.Write(b[:])
		h.Write([]byte(t))
	}
	for _, m := range s.Merges {
		binary.LittleEndian.PutUint32(b[:4], uint32(len(m)))
		h.Write(b[:4])
		h.Write([]byte(m))
	}
	return "vocab-" + hex.EncodeToString(h.Sum(nil)[:16])
}
