package reqfsm

import (
	"iter"
	"unsafe"
)

// TokenLogprobs is a token's log-probability and its most likely
// alternatives (most likely first, ties by lower id).
type TokenLogprobs struct {
	Logprob float64 `json:"lp"`
	// Piece is the token's bytes in the serving model's vocabulary (nil
	// from a worker that does not say: the built-in one's).
	Piece []byte       `json:"p,omitempty"`
	Top   []TopLogprob `json:"top,omitempty"`
}

// TopLogprob is one alternative at a position.
type TopLogprob struct {
	ID      int     `json:"id"`
	Logprob float64 `json:"lp"`
	Piece   []byte  `json:"p,omitempty"`
}

// TokenLog is a request's committed output, stored for as long as the
// request can be resumed. A frontend holds one per open stream, so it is
// kept compact: a token costs 8 bytes and its text's bytes (a []Token
// costs 56 and a string allocation each), the instances that produced the
// tokens are kept as runs, and log-probabilities only when a token has
// them.
//
// The log only grows and a token in it never changes: view hands readers
// a copy cut to its length, which they read without a lock while the
// request's own log grows past it (appends never write what a view
// covers, and a full slice is reallocated, not written over). For the
// same reason a token's text is a string over the log's text bytes
// without a copy (unsafe.String): those bytes are never written again.
type TokenLog struct {
	toks []logEntry
	text []byte
	// lps[i] are token i's log-probabilities; nil until a token has some.
	lps  []*TokenLogprobs
	runs []instanceRun
}

// logEntry is a token's id and where its text ends in the log's text.
type logEntry struct {
	id  int32
	end uint32
}

// instanceRun: the tokens from index from on were produced by instance.
type instanceRun struct {
	from     int
	instance string
}

// Len is the number of tokens.
func (l *TokenLog) Len() int { return len(l.toks) }

// Add appends t as the next token (its SequenceNo is its place).
func (l *TokenLog) Add(t Token) {
	n := len(l.toks)
	l.text = append(l.text, t.Text...)
	l.toks = append(l.toks, logEntry{id: int32(t.ID), end: uint32(len(l.text))})
	if t.Logprobs != nil && l.lps == nil {
		l.lps = make([]*TokenLogprobs, n, cap(l.toks))
	}
	if l.lps != nil {
		l.lps = append(l.lps, t.Logprobs)
	}
	if len(l.runs) == 0 || l.runs[len(l.runs)-1].instance != t.Instance {
		l.runs = append(l.runs, instanceRun{from: n, instance: t.Instance})
	}
}

// At is token i (0-based: sequence number i+1).
func (l *TokenLog) At(i int) Token {
	start := uint32(0)
	if i > 0 {
		start = l.toks[i-1].end
	}
	t := Token{SequenceNo: i + 1, ID: int(l.toks[i].id)}
	if end := l.toks[i].end; end > start {
		t.Text = unsafe.String(&l.text[start], end-start)
	}
	if l.lps != nil {
		t.Logprobs = l.lps[i]
	}
	for r := len(l.runs) - 1; r >= 0; r-- {
		if l.runs[r].from <= i {
			t.Instance = l.runs[r].instance
			break
		}
	}
	return t
}

// From yields the tokens from index from (0-based) on.
func (l *TokenLog) From(from int) iter.Seq[Token] {
	return func(yield func(Token) bool) {
		for i := max(from, 0); i < l.Len(); i++ {
			if !yield(l.At(i)) {
				return
			}
		}
	}
}

// Tokens is every token, as a slice (for a whole response's rendering).
func (l *TokenLog) Tokens() []Token {
	out := make([]Token, l.Len())
	for i := range out {
		out[i] = l.At(i)
	}
	return out
}

// IDs is every token's id.
func (l *TokenLog) IDs() []int {
	out := make([]int, l.Len())
	for i, e := range l.toks {
		out[i] = int(e.id)
	}
	return out
}

// TextOf is the text of the first n tokens (all of them if there are
// fewer).
func (l *TokenLog) TextOf(n int) []byte {
	if n = min(n, l.Len()); n <= 0 {
		return nil
	}
	return l.text[:l.toks[n-1].end]
}

// LastInstance is the instance that produced the last token ("" if none).
func (l *TokenLog) LastInstance() string {
	if len(l.runs) == 0 {
		return ""
	}
	return l.runs[len(l.runs)-1].instance
}

// View is the log as it is now, for a reader: every slice cut to its
// length, so that nothing appended later writes into what it covers.
func (l *TokenLog) View() TokenLog {
	return TokenLog{toks: l.toks[:len(l.toks):len(l.toks)], text: l.text[:len(l.text):len(l.text)],
		lps: l.lps[:len(l.lps):len(l.lps)], runs: l.runs[:len(l.runs):len(l.runs)]}
}
