// Package tokenizer turns text into token ids and back for the reference
// engine: a built-in word-piece vocabulary with byte fallback, llama2.c's
// tokenizer.bin format, and an incremental detokenizer that only ever emits
// complete UTF-8.
package tokenizer

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrInvalidUTF8 is returned by Encode for text that is not valid UTF-8.
var ErrInvalidUTF8 = errors.New("tokenizer: text is not valid UTF-8")

// ErrBadToken is returned for a token id outside the vocabulary.
var ErrBadToken = errors.New("tokenizer: token id out of range")

// Tokenizer maps text to token ids and ids to bytes.
type Tokenizer interface {
	// Encode returns the ids of text, without BOS.
	Encode(text string) ([]int, error)
	// Piece returns the bytes token id stands for when it follows prev. A
	// byte-fallback piece is a single byte and may be an incomplete UTF-8
	// sequence; Detokenizer reassembles those.
	Piece(prev, id int) []byte
	VocabSize() int
	BOS() int
	EOS() int
	// Hash identifies the vocabulary and the encoding algorithm; it is part
	// of a KV block's identity.
	Hash() string
}

// CheckIDs returns an error naming the first id outside the vocabulary.
func CheckIDs(t Tokenizer, ids []int) error {
	for i, id := range ids {
		if id < 0 || id >= t.VocabSize() {
			return fmt.Errorf("tokenizer: id %d at index %d (vocabulary has %d): %w", id, i, t.VocabSize(), ErrBadToken)
		}
	}
	return nil
}

// Decode returns the text of ids as a whole, decoded as the first tokens
// after BOS.
func Decode(t Tokenizer, ids []int) string {
	d := NewDetokenizer(t)
	var out []byte
	for _, id := range ids {
		out = append(out, d.Push(id)...)
	}
	return string(append(out, d.Flush()...))
}

// Detokenizer turns a stream of token ids into text chunks. Each chunk is
// valid UTF-8 and never ends inside a multi-byte character: bytes of an
// incomplete character are held until the rest arrives. Bytes that can never
// form a character come out as U+FFFD.
type Detokenizer struct {
	tok     Tokenizer
	prev    int
	pending []byte
}

// NewDetokenizer starts a stream right after BOS.
func NewDetokenizer(t Tokenizer) *Detokenizer {
	return NewDetokenizerAfter(t, t.BOS())
}

// NewDetokenizerAfter starts a stream that follows token prev, e.g. the
// last prompt token.
func NewDetokenizerAfter(t Tokenizer, prev int) *Detokenizer {
	return &Detokenizer{tok: t, prev: prev}
}

// Push adds one token and returns the text it completes.
func (d *Detokenizer) Push(id int) string {
	d.pending = append(d.pending, d.tok.Piece(d.prev, id)...)
	d.prev = id
	var out []byte
	p := d.pending
	for len(p) > 0 {
		r, size := utf8.DecodeRune(p)
		if r == utf8.RuneError && size <= 1 {
			if !utf8.FullRune(p) {
				break // the rest of the character may still come
			}
			out = utf8.AppendRune(out, utf8.RuneError)
			p = p[1:]
			continue
		}
		out = append(out, p[:size]...)
		p = p[size:]
	}
	d.pending = append(d.pending[:0], p...)
	return string(out)
}

// Flush returns what is held back, as U+FFFD for each incomplete character.
func (d *Detokenizer) Flush() string {
	if len(d.pending) == 0 {
		return ""
	}
	d.pending = d.pending[:0]
	return string(utf8.RuneError)
}
