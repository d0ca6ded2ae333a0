package tokenizer

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

//go:embed words.txt
var wordList string

// Builtin ids of the special tokens; byte b falls back to id ByteBase+b.
const (
	UnkID    = 0
	BOSID    = 1
	EOSID    = 2
	ByteBase = 3
)

// extraPieces are pieces that are not whole words: suffixes, punctuation
// with spacing, and some multi-byte characters so that streams exercise
// UTF-8 reassembly.
var extraPieces = []string{
	"s", "es", "ed", "ing", "er", "ers", "ly", "tion", "ness", "ment", "able", "al", "est",
	"'s", "n't", "'re", "'ll", ", ", ". ", ".\n", "!\n", "?\n", "\n\n", "  ", "    ",
	"é", "ü", "ö", "ñ", "ç", "—", "–", "’", "“", "”", "…", "°", "€", "π", "λ", "→",
	"的", "是", "不", "了", "人", "我", "在", "有", "他", "这", "中", "大", "来", "上", "国", "个", "到", "说", "们", "为",
	"请", "求", "流", "式", "生", "成", "故", "障", "恢", "复", "🙂", "🚀",
}

// Builtin is the engine's own vocabulary: specials, 256 byte-fallback
// tokens, printable ASCII, English words with and without a leading space,
// and the extra pieces. Encoding is greedy longest match, which is
// deterministic and keeps words whole.
type Builtin struct {
	pieces []string
	ids    map[string]int
	maxLen int
	hash   string
}

var builtin = newBuiltin()

// NewBuiltin returns the built-in tokenizer. It is immutable and shared.
func NewBuiltin() *Builtin { return builtin }

func newBuiltin() *Builtin {
	b := &Builtin{ids: make(map[string]int)}
	add := func(p string) {
		if _, ok := b.ids[p]; ok || p == "" {
			return
		}
		b.ids[p] = len(b.pieces)
		b.pieces = append(b.pieces, p)
		b.maxLen = max(b.maxLen, len(p))
	}
	b.pieces = append(b.pieces, "<unk>", "<s>", "</s>")
	for i := 0; i < 256; i++ {
		b.pieces = append(b.pieces, fmt.Sprintf("<0x%02X>", i))
	}
	for c := byte(0x20); c < 0x7f; c++ {
		add(string(c))
	}
	add("\n")
	add("\t")
	words := strings.Fields(wordList)
	for i, w := range words {
		add(" " + w)
		add(w)
		if i < 300 {
			r, size := utf8.DecodeRuneInString(w)
			cw := string(unicode.ToUpper(r)) + w[size:]
			add(" " + cw)
			add(cw)
		}
	}
	for _, p := range extraPieces {
		add(p)
	}
	h := sha256.New()
	h.Write([]byte("lifeline-builtin-longest-match/v1\x00"))
	for _, p := range b.pieces {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	b.hash = hex.EncodeToString(h.Sum(nil))
	return b
}

func (b *Builtin) VocabSize() int { return len(b.pieces) }
func (b *Builtin) BOS() int       { return BOSID }
func (b *Builtin) EOS() int       { return EOSID }
func (b *Builtin) Hash() string   { return b.hash }

// IsByteFallback reports whether id stands for a single raw byte.
func (b *Builtin) IsByteFallback(id int) bool { return id >= ByteBase && id < ByteBase+256 }

// IsSpecial reports whether id is <unk>, <s> or </s>.
func (b *Builtin) IsSpecial(id int) bool { return id >= 0 && id < ByteBase }

// PieceString returns the vocabulary entry of id as written in the vocabulary.
func (b *Builtin) PieceString(id int) string { return b.pieces[id] }

func (b *Builtin) Piece(_, id int) []byte {
	switch {
	case id < 0 || id >= len(b.pieces) || b.IsSpecial(id):
		return nil
	case b.IsByteFallback(id):
		return []byte{byte(id - ByteBase)}
	}
	return []byte(b.pieces[id])
}

func (b *Builtin) Encode(text string) ([]int, error) {
	if !utf8.ValidString(text) {
		return nil, ErrInvalidUTF8
	}
	ids := make([]int, 0, len(text)/3+1)
	for i := 0; i < len(text); {
		n := min(b.maxLen, len(text)-i)
		matched := false
		for ; n > 0; n-- {
			if id, ok := b.ids[text[i:i+n]]; ok {
				ids = append(ids, id)
				i += n
				matched = true
				break
			}
		}
		if !matched {
			_, size := utf8.DecodeRuneInString(text[i:])
			for k := 0; k < size; k++ {
				ids = append(ids, ByteBase+int(text[i+k]))
			}
			i += size
		}
	}
	return ids, nil
}

// MaxPieceLen is the longest piece in bytes: a text of n bytes encodes
// to at least n / MaxPieceLen tokens.
func (b *Builtin) MaxPieceLen() int { return b.maxLen }
