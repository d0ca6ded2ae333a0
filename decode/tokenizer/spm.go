package tokenizer

import (
	"container/heap"
	"fmt"
)

// symbol is a run of text during a merge: bytes [at, at+n) of the text,
// linked to its neighbours (-1: none); n is 0 once merged into the left.
type symbol struct {
	at, n      int
	prev, next int
}

// bigram is a candidate merge of two neighbouring symbols. SentencePiece
// takes the highest score first, BPE the lowest rank; both the leftmost
// on a tie.
type bigram struct {
	left, right int
	score       float32
	rank        int
	size        int
	text        string
}

type bigrams struct {
	q   []bigram
	spm bool
}

func (b *bigrams) Len() int { return len(b.q) }
func (b *bigrams) Less(i, j int) bool {
	x, y := b.q[i], b.q[j]
	if b.spm && x.score != y.score {
		return x.score > y.score
	}
	if !b.spm && x.rank != y.rank {
		return x.rank < y.rank
	}
	return x.left < y.left
}
func (b *bigrams) Swap(i, j int) { b.q[i], b.q[j] = b.q[j], b.q[i] }
func (b *bigrams) Push(x any)    { b.q = append(b.q, x.(bigram)) }
func (b *bigrams) Pop() any {
	x := b.q[len(b.q)-1]
	b.q = b.q[:len(b.q)-1]
	return x
}

// merge joins symbol right into its left neighbour left.
func merge(syms []symbol, left, right int) {
	l, r := &syms[left], &syms[right]
	l.n += r.n
	r.n = 0
	l.next = r.next
	if r.next >= 0 {
		syms[r.next].prev = left
	}
}

// charSymbols splits text into one symbol per UTF-8 character (by its
// first byte's length, as llama.cpp does).
func charSymbols(text string) []symbol {
	var syms []symbol
	for at := 0; at < len(text); {
		n := min(utf8LenOf(text[at]), len(text)-at)
		syms = append(syms, symbol{at: at, n: n, prev: len(syms) - 1, next: len(syms) + 1})
		at += n
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

func utf8LenOf(b byte) int {
	switch {
	case b < 0x80:
		return 1
	case b&0xE0 == 0xC0:
		return 2
	case b&0xF0 == 0xE0:
		return 3
	case b&0xF8 == 0xF0:
		return 4
	}
	return 1
}

// encodeSPM appends the SentencePiece tokens of text (spaces already
// "▁"): the best-scored neighbouring pair that is a token merges first;
// what never becomes a token falls back to byte tokens.
func (v *Vocab) encodeSPM(text string, out []int) []int {
	syms := charSymbols(text)
	q := &bigrams{spm: true}
	try := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		t := text[syms[l].at : syms[l].at+syms[l].n+syms[r].n]
		if id, ok := v.ids[t]; ok {
			heap.Push(q, bigram{left: l, right: r, score: v.scores[id], size: len(t)})
		}
	}
	for i := 1; i < len(syms); i++ {
		try(i-1, i)
	}
	for q.Len() > 0 {
		b := heap.Pop(q).(bigram)
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue
		}
		merge(syms, b.left, b.right)
		try(l.prev, b.left)
		try(b.left, l.next)
	}
	for i := 0; i >= 0 && len(syms) > 0; i = syms[i].next {
		t := text[syms[i].at : syms[i].at+syms[i].n]
		if id, ok := v.ids[t]; ok {
			out = append(out, id)
			continue
		}
		for j := 0; j < len(t); j++ {
			if id := v.byteTok[t[j]]; id >= 0 {
				out = append(out, id)
			}
		}
	}
	return out
}

// spmByteTokens is each byte's token for SentencePiece's fallback:
// "<0xXX>", else the byte itself as a token, else the unknown token (-1:
// none, the byte is dropped).
func (v *Vocab) spmByteTokens() {
	for b := range v.byteTok {
		id, ok := v.ids[fmt.Sprintf("<0x%02X>", b)]
		if !ok {
			id, ok = v.ids[string([]byte{byte(b)})]
		}
		if !ok {
			id = v.unk
		}
		v.byteTok[b] = id
	}
}
