//go:build llamacpp

package llamacpp

/*
#include <stdlib.h>
#include "llama.h"
*/
import "C"

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
)

// Engine is a context as the scheduler's engine (decode/sched.Engine):
// one KV stream per sequence slot, one llama_decode per step for every
// running sequence, raw logits out. It is not safe for concurrent use
// (the scheduler steps one at a time).
type Engine struct {
	c *Context
	// next is each slot's next position: what its KV stream holds ends
	// there. An input below it drops the rest first.
	next   []int32
	in     []Input
	ctxLen int
}

// NewEngine is an engine over a new context of m with slots sequences
// of ctxLen positions each and steps of up to batch inputs.
func (m *Model) NewEngine(ctxLen, slots, batch, threads int) (*Engine, error) {
	c, err := m.NewContext(ContextParams{Context: ctxLen, Sequences: slots, Batch: batch, Threads: threads})
	if err != nil {
		return nil, err
	}
	return &Engine{c: c, next: make([]int32, slots), ctxLen: ctxLen}, nil
}

// Close frees the context.
func (e *Engine) Close() { e.c.Close() }

// Context is the engine's context (export and import of a slot's KV).
func (e *Engine) Context() *Context { return e.c }

func (e *Engine) VocabSize() int  { return e.c.vocab }
func (e *Engine) ContextLen() int { return e.ctxLen }

// Forward computes one step. The store only counts blocks here: K/V is
// in the context, by slot (model.Input.Seq).
func (e *Engine) Forward(_ kvcache.Store, in []model.Input) error {
	e.in = e.in[:0]
	for _, x := range in {
		s := int32(x.Seq)
		if err := e.c.checkSeq(s); err != nil {
			return err
		}
		switch p := int32(x.Pos); {
		case p < e.next[s]:
			e.c.Forget(s, p)
		case p > e.next[s]:
			return fmt.Errorf("llamacpp: slot %d at position %d holds only %d", s, p, e.next[s])
		}
		e.next[s] = int32(x.Pos) + 1
		e.in = append(e.in, Input{Seq: s, Pos: int32(x.Pos), Token: int32(x.Token), Logits: x.Logits != nil})
	}
	if err := e.c.Decode(e.in); err != nil {
		// What llama.cpp kept of the batch is unknown: its slots start
		// over (the scheduler ends their sequences).
		for _, x := range e.in {
			e.c.Forget(x.Seq, 0)
			e.next[x.Seq] = 0
		}
		return err
	}
	k := 0
	for _, x := range in {
		if x.Logits == nil {
			continue
		}
		p := C.llama_get_logits_ith(e.c.c, C.int32_t(e.c.logits[k]))
		if p == nil {
			return fmt.Errorf("llamacpp: no logits for input %d", e.c.logits[k])
		}
		copy(x.Logits, unsafe.Slice((*float32)(unsafe.Pointer(p)), e.c.vocab))
		k++
	}
	return nil
}

// Tokenizer is a model's vocabulary as Lifeline's tokenizer
// (decode/tokenizer.Tokenizer): llama.cpp encodes and spells.
type Tokenizer struct {
	m    *Model
	hash string
	eog  []int
}

// Tokenizer is m's vocabulary.
func (m *Model) Tokenizer() *Tokenizer {
	t := &Tokenizer{m: m, hash: m.vocabHash()}
	for id := range int32(m.VocabSize()) {
		if m.IsEOG(id) {
			t.eog = append(t.eog, int(id))
		}
	}
	return t
}

// Encode is text's tokens without BOS; special tokens written in text
// (a chat template's "<|im_start|>") are themselves, as llama.cpp's
// server encodes a prompt.
func (t *Tokenizer) Encode(text string) ([]int, error) {
	ids, err := t.m.Tokenize(text, false, true)
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out, err
}

// Piece is the bytes of id (control tokens spell nothing).
func (t *Tokenizer) Piece(_, id int) []byte { return t.m.Piece(int32(id), false) }

func (t *Tokenizer) VocabSize() int { return t.m.VocabSize() }
func (t *Tokenizer) BOS() int       { return int(t.m.BOS()) }
func (t *Tokenizer) EOS() int       { return int(t.m.EOS()) }
func (t *Tokenizer) Hash() string   { return t.hash }

// AddBOS says whether a prompt starts with BOS (qwen2's does not).
func (t *Tokenizer) AddBOS() bool {
	return bool(C.llama_vocab_get_add_bos(t.m.vocab)) && t.m.BOS() >= 0
}

// EndOfGeneration is every token that ends generation (EOS, EOT, a chat
// template's end of turn).
func (t *Tokenizer) EndOfGeneration() []int { return t.eog }

// vocabHash identifies the vocabulary and how it encodes: the tokenizer
// model and pre-tokenizer the file names, and every token's text, score
// and attributes.
func (m *Model) vocabHash() string {
	h := sha256.New()
	for _, k := range []string{"tokenizer.ggml.model", "tokenizer.ggml.pre"} {
		fmt.Fprintf(h, "%s=%s;", k, m.Meta(k))
	}
	fmt.Fprintf(h, "type=%d;bos=%d;add_bos=%t;", C.llama_vocab_type(m.vocab), m.BOS(), bool(C.llama_vocab_get_add_bos(m.vocab)))
	var b [8]byte
	for id := range C.llama_token(m.VocabSize()) {
		text := C.GoString(C.llama_vocab_get_text(m.vocab, id))
		binary.LittleEndian.PutUint32(b[:4], uint32(len(text)))
		binary.LittleEndian.PutUint32(b[4:], math.Float32bits(float32(C.llama_vocab_get_score(m.vocab, id))))
		h.Write(b[:])
		h.Write([]byte(text))
		binary.LittleEndian.PutUint32(b[:4], uint32(C.llama_vocab_get_attr(m.vocab, id)))
		h.Write(b[:4])
	}
	return "gguf-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// Meta is the model's metadata value of key as text ("" when absent).
func (m *Model) Meta(key string) string {
	ckey := C.CString(key)
	defer C.free(unsafe.Pointer(ckey))
	buf := make([]byte, 256)
	for {
		n := C.llama_model_meta_val_str(m.m, ckey, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
		if n < 0 {
			return ""
		}
		if int(n) < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, n+1)
	}
}

// Desc is llama.cpp's description of the model ("qwen2 1B Q8_0").
func (m *Model) Desc() string {
	buf := make([]byte, 256)
	n := C.llama_model_desc(m.m, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	if n < 0 {
		return ""
	}
	return string(buf[:min(int(n), len(buf)-1)])
}

// Export is slot's whole K/V state (Context.Export).
func (e *Engine) Export(slot int) ([]byte, error) { return e.c.Export(int32(slot)) }

// ExportInto is Export into *buf (Context.ExportInto).
func (e *Engine) ExportInto(slot int, buf *[]byte) ([]byte, error) {
	return e.c.ExportInto(int32(slot), buf)
}

// Restore replaces slot's K/V with state (an Export of a context of the
// same model and settings) and keeps its first keep positions.
func (e *Engine) Restore(slot int, state []byte, keep int) error {
	s := int32(slot)
	if err := e.c.checkSeq(s); err != nil {
		return err
	}
	e.next[s] = 0
	if err := e.c.Import(s, state); err != nil {
		return err
	}
	e.c.Forget(s, int32(keep))
	e.next[s] = int32(keep)
	return nil
}

// StateSize is what Export of a slot of n positions weighs, as
// base + perPosition·n, measured on slot (left empty).
func (e *Engine) StateSize(slot int) (base, perPosition int, err error) {
	s := int32(slot)
	e.c.Forget(s, 0)
	e.next[s] = 0
	defer e.c.Forget(s, 0)
	var size [2]int
	for n := range 2 {
		in := []Input{{Seq: s, Pos: int32(n), Token: max(e.c.m.BOS(), 0)}}
		if err := e.c.Decode(in); err != nil {
			return 0, 0, err
		}
		b, err := e.c.Export(s)
		if err != nil {
			return 0, 0, err
		}
		size[n] = len(b)
	}
	return 2*size[0] - size[1], size[1] - size[0], nil
}

// Continuation guarantees a configuration can give, strongest first.
const (
	// BitExact: a sequence's logits are the same bits alone or in any
	// batch, for its prompt whole or in chunks, with its prefix computed
	// or imported: a continuation elsewhere is the run that never failed.
	BitExact = "bit-exact"
	// TokenExact: the logits may differ in their last bits, but the
	// greedy tokens agree: a continuation keeps the committed prefix and
	// greedy output; a sampled token may differ where two were close.
	TokenExact = "token-exact"
	// Inexact: even greedy tokens may differ.
	Inexact = "inexact"
)

// Invariance is what CheckInvariance found.
type Invariance struct {
	// Batch, Chunks and Import say whether the logits kept their bits in
	// a batch with another sequence, for the prompt in chunks, and after
	// an imported prefix; Tokens whether every greedy token agreed.
	Batch, Chunks, Import, Tokens bool
}

// Guarantee is the continuation guarantee inv supports.
func (inv Invariance) Guarantee() string {
	switch {
	case inv.Batch && inv.Chunks && inv.Import:
		return BitExact
	case inv.Tokens:
		return TokenExact
	}
	return Inexact
}

// CheckInvariance measures, on two empty slots a and b (left empty), what
// the engine's continuation contract rests on: prompt's last logits alone
// vs in a batch with another sequence, whole vs in chunks of 5, and a
// continuation of an imported prefix vs of a computed one.
func (e *Engine) CheckInvariance(a, b int, prompt []int32) (Invariance, error) {
	sa, sb := int32(a), int32(b)
	for _, s := range []int32{sa, sb} {
		if err := e.c.checkSeq(s); err != nil {
			return Invariance{}, err
		}
		e.c.Forget(s, 0)
		e.next[s] = 0
	}
	defer func() {
		for _, s := range []int32{sa, sb} {
			e.c.Forget(s, 0)
			e.next[s] = 0
		}
	}()
	if len(prompt) < 8 {
		return Invariance{}, fmt.Errorf("llamacpp: an invariance check needs 8 tokens, not %d", len(prompt))
	}
	run := e.c.decodeAll
	inputs := func(s int32, from, to int, logits bool) []Input {
		var in []Input
		for p := from; p < to; p++ {
			in = append(in, Input{Seq: s, Pos: int32(p), Token: prompt[p], Logits: logits && p == to-1})
		}
		return in
	}
	n := len(prompt)
	alone, err := run(inputs(sa, 0, n, true))
	if err != nil {
		return Invariance{}, err
	}
	e.c.Forget(sa, 0)
	other := inputs(sb, 0, n/2, true)
	for i := range other {
		other[i].Token = prompt[n-1-i]
	}
	batched, err := run(append(inputs(sa, 0, n, true), other...))
	if err != nil {
		return Invariance{}, err
	}
	e.c.Forget(sa, 0)
	e.c.Forget(sb, 0)
	var chunks [][]Input
	for p := 0; p < n; p += 5 {
		chunks = append(chunks, inputs(sa, p, min(p+5, n), p+5 >= n))
	}
	chunked, err := run(chunks...)
	if err != nil {
		return Invariance{}, err
	}
	// The prefix up to n-1 exported from a into b; both compute the last.
	e.c.Forget(sa, int32(n-1))
	state, err := e.c.Export(sa)
	if err != nil {
		return Invariance{}, err
	}
	if err := e.c.Import(sb, state); err != nil {
		return Invariance{}, err
	}
	both, err := run(append(inputs(sa, n-1, n, true), inputs(sb, n-1, n, true)...))
	if err != nil {
		return Invariance{}, err
	}
	same := func(x, y []float32) bool { return slices.Equal(bitsOf(x), bitsOf(y)) }
	inv := Invariance{Batch: same(alone[0], batched[0]), Chunks: same(alone[0], chunked[len(chunked)-1]), Import: same(both[0], both[1])}
	inv.Tokens = Argmax(alone[0]) == Argmax(batched[0]) && Argmax(alone[0]) == Argmax(chunked[len(chunked)-1]) && Argmax(both[0]) == Argmax(both[1])
	return inv, nil
}

func bitsOf(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, f := range v {
		out[i] = math.Float32bits(f)
	}
	return out
}

// Argmax is the greedy pick over logits v: the highest, lowest id on
// ties (as Lifeline's sampler picks at temperature 0).
func Argmax(v []float32) int {
	best := 0
	for i, f := range v {
		if f > v[best] {
			best = i
		}
	}
	return best
}

// decodeAll decodes each part in turn and returns the logits each asked
// for, in order.
func (c *Context) decodeAll(parts ...[]Input) ([][]float32, error) {
	var out [][]float32
	for _, in := range parts {
		if err := c.Decode(in); err != nil {
			return nil, err
		}
		for i := range c.logits {
			l, err := c.Logits(i, nil)
			if err != nil {
				return nil, err
			}
			out = append(out, l)
		}
	}
	return out, nil
}
