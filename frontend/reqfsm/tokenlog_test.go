package reqfsm

import (
	"slices"
	"testing"
)

// logOf is a log of toks (numbered from 1 in order, whatever their
// SequenceNo).
func logOf(toks []Token) TokenLog {
	var l TokenLog
	for _, t := range toks {
		l.Add(t)
	}
	return l
}

// A view handed to a reader keeps what it covered while the log grows
// past it, through reallocations; texts, ids, instances and logprobs read
// back as added.
func TestTokenLogViewsStayWhatTheyWere(t *testing.T) {
	var l TokenLog
	lp := &TokenLogprobs{}
	var views []TokenLog
	var want []Token
	for i := range 300 {
		tok := Token{SequenceNo: i + 1, ID: 1000 + i, Text: string(rune('a' + i%26)), Instance: "d0"}
		if i%7 == 0 {
			tok.Text = "" // a token without text (a special one)
		}
		if i >= 100 {
			tok.Instance = "d1"
		}
		if i == 150 {
			tok.Logprobs = lp
		}
		l.Add(tok)
		want = append(want, tok)
		views = append(views, l.View())
	}
	for n, v := range views {
		if v.Len() != n+1 {
			t.Fatalf("view %d: %d tokens", n, v.Len())
		}
		got := v.Tokens()
		if !slices.Equal(got, want[:n+1]) {
			t.Fatalf("view %d: got %+v, want %+v", n, got[n], want[n])
		}
	}
	if l.LastInstance() != "d1" || string(l.TextOf(3)) != "bc" || l.TextOf(0) != nil || len(l.TextOf(1000)) != len(l.text) {
		t.Fatalf("last instance %q, text of 3 %q", l.LastInstance(), l.TextOf(3))
	}
	var from []int
	for tok := range l.From(297) {
		from = append(from, tok.SequenceNo)
	}
	if !slices.Equal(from, []int{298, 299, 300}) || !slices.Equal(l.IDs()[:2], []int{1000, 1001}) {
		t.Fatalf("from 297: %v, ids %v", from, l.IDs()[:2])
	}
}

// The log's point: a token costs a few bytes, not a Token's 56 and a
// string each.
func TestTokenLogIsCompact(t *testing.T) {
	var l TokenLog
	allocs := testing.AllocsPerRun(10, func() {
		l = TokenLog{}
		for i := range 200 {
			l.Add(Token{SequenceNo: i + 1, ID: i, Text: " tok", Instance: "d0"})
		}
	})
	bytes := cap(l.toks)*8 + cap(l.text) + cap(l.lps)*8 + cap(l.runs)*24
	if bytes > 200*16 || allocs > 40 {
		t.Fatalf("200 tokens: %d bytes, %.0f allocations", bytes, allocs)
	}
}
