package tokenizer

import (
	"cmp"
	"container/heap"
	"fmt"
	"slices"
	"strings"

	"github.com/dlclark/regexp2"
)

// The pre-tokenizers llama.cpp applies for a GGUF's tokenizer.ggml.pre,
// as regular expressions: each splits the pieces the previous one left,
// and the text between two matches is a piece of its own.
var (
	preLlama3  = []string{`(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`}
	preQwen2   = []string{`(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`}
	preGPT2    = []string{`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`}
	preDefault = []string{`[\p{P}\$\+<=>\^~\|]+`, `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`,
		`\p{N}+`, `[0-9][0-9][0-9]`}
)

// preTokenizer is a pre-tokenizer by the name GGUF gives it, and whether
// llama.cpp takes a pre-token that is itself a token whole (ignore_merges)
// and starts a prompt with BOS by default.
type preTokenizer struct {
	exprs         []string
	ignoreMerges  bool
	addBOSDefault bool
}

var preTokenizers = map[string]preTokenizer{
	"default":          {exprs: preDefault},
	"llama3":           {exprs: preLlama3, ignoreMerges: true, addBOSDefault: true},
	"llama-v3":         {exprs: preLlama3, ignoreMerges: true, addBOSDefault: true},
	"llama-bpe":        {exprs: preLlama3, ignoreMerges: true, addBOSDefault: true},
	"falcon3":          {exprs: preLlama3, ignoreMerges: true, addBOSDefault: true},
	"pixtral":          {exprs: preLlama3, ignoreMerges: true, addBOSDefault: true},
	"qwen2":            {exprs: preQwen2},
	"deepseek-r1-qwen": {exprs: preQwen2},
	"megrez":           {exprs: preQwen2},
	"gpt-2":            {exprs: preGPT2},
	"phi-2":            {exprs: preGPT2},
}

// PreTokenizers lists the pre-tokenizer names NewVocab reads.
func PreTokenizers() []string {
	var out []string
	for k := range preTokenizers {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func (v *Vocab) initBPE(s Spec) error {
	pre, ok := preTokenizers[cmp.Or(s.Pre, "default")]
	if !ok {
		return fmt.Errorf("%w: pre-tokenizer %q (Lifeline's engine reads %s; engine: llamacpp reads more)", ErrUnsupportedVocab, s.Pre, strings.Join(PreTokenizers(), ", "))
	}
	v.ignoreMrg = pre.ignoreMerges
	for _, e := range pre.exprs {
		re, err := regexp2.Compile(e, regexp2.None)
		if err != nil {
			return fmt.Errorf("%w: pre-tokenizer %q: %v", ErrUnsupportedVocab, s.Pre, err)
		}
		v.pre = append(v.pre, re)
	}
	v.ranks = make(map[string]int, len(s.Merges))
	for i, m := range s.Merges {
		sp := strings.IndexByte(m, ' ')
		if sp == 0 {
			sp = strings.IndexByte(m[1:], ' ') + 1
		}
		if sp <= 0 {
			return fmt.Errorf("%w: merge %d (%q) is not two tokens apart by a space", ErrUnsupportedVocab, i, m)
		}
		if _, dup := v.ranks[m]; !dup {
			v.ranks[m] = i
		}
	}
	return nil
}

// byteLevel is GPT-2's byte-level alphabet: each byte as a printable
// rune (printable ASCII and Latin-1 as themselves, the rest from U+0100
// on), and its inverse.
var byteLevel, byteOfRune = func() ([256]string, map[rune]byte) {
	var fwd [256]string
	inv := make(map[rune]byte, 256)
	n := 0
	for b := range 256 {
		r := rune(b)
		if !((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
			r = rune(256 + n)
			n++
		}
		fwd[b], inv[r] = string(r), byte(b)
	}
	return fwd, inv
}()

// decodeByteLevel is the bytes a byte-level token's text stands for; a
// rune outside the alphabet comes out as llama.cpp writes it.
func decodeByteLevel(text string) []byte {
	var out []byte
	for _, r := range text {
		if b, ok := byteOfRune[r]; ok {
			out = append(out, b)
			continue
		}
		out = append(out, "[UNK_BYTE_0x"...)
		for _, c := range []byte(string(r)) {
			out = fmt.Appendf(out, "%02x", c)
		}
		out = append(out, text...)
		out = append(out, ']')
	}
	return out
}

// split applies the pre-tokenizer's expressions in turn.
func (v *Vocab) split(text string) []string {
	parts := []string{text}
	for _, re := range v.pre {
		var next []string
		for _, p := range parts {
			runes := []rune(p)
			end := 0
			m, _ := re.FindRunesMatch(runes)
			for ; m != nil; m, _ = re.FindNextMatch(m) {
				if m.Index > end {
					next = append(next, string(runes[end:m.Index]))
				}
				if m.Length > 0 {
					next = append(next, string(runes[m.Index:m.Index+m.Length]))
				}
				end = m.Index + m.Length
			}
			if end < len(runes) {
				next = append(next, string(runes[end:]))
			}
		}
		parts = next
	}
	return parts
}

// encodeBPE appends the byte-level BPE tokens of text: each pre-token's
// bytes as the alphabet's runes, then the lowest-ranked merge of
// neighbouring symbols first.
func (v *Vocab) encodeBPE(text string, out []int) []int {
	for _, word := range v.split(text) {
		var sb strings.Builder
		for i := 0; i < len(word); i++ {
			sb.WriteString(byteLevel[word[i]])
		}
		w := sb.String()
		if _, ok := v.ids[w]; ok && v.ignoreMrg {
			out = append(out, v.ids[w])
			continue
		}
		out = v.mergeBPE(w, out)
	}
	return out
}

func (v *Vocab) mergeBPE(w string, out []int) []int {
	syms := charSymbols(w)
	q := &bigrams{}
	try := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		lt := w[syms[l].at : syms[l].at+syms[l].n]
		rt := w[syms[r].at : syms[r].at+syms[r].n]
		if rank, ok := v.ranks[lt+" "+rt]; ok {
			heap.Push(q, bigram{left: l, right: r, rank: rank, text: lt + rt})
		}
	}
	for i := 1; i < len(syms); i++ {
		try(i-1, i)
	}
	for q.Len() > 0 {
		b := heap.Pop(q).(bigram)
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != len(b.text) || w[l.at:l.at+l.n+r.n] != b.text {
			continue
		}
		merge(syms, b.left, b.right)
		try(l.prev, b.left)
		try(b.left, l.next)
	}
	for _, s := range syms {
		if s.n == 0 {
			continue
		}
		t := w[s.at : s.at+s.n]
		if id, ok := v.ids[t]; ok {
			out = append(out, id)
			continue
		}
		for j := 0; j < len(t); j++ { // llama.cpp looks each byte of the text up
			if id, ok := v.ids[t[j:j+1]]; ok {
				out = append(out, id)
			}
		}
	}
	return out
}
