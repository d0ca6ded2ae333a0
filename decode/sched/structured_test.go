package sched

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

func builtinGrammar(t *testing.T, schema string, optional bool) *Grammar {
	t.Helper()
	a, err := grammar.Compile([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	tok := tokenizer.NewBuiltin()
	pieces := make([][]byte, tok.VocabSize())
	for id := range pieces {
		pieces[id] = tok.Piece(tok.EOS(), id)
	}
	return &Grammar{Automaton: a, Vocab: grammar.NewVocab(pieces, tok.EOS()), Optional: optional}
}

// TestPickNextIsAFunctionOfHistory: the grammar state pickNext masks with
// depends on the history it is given only — the sequence's state for
// fewer delivered tokens (a verifier's speculated tokens beyond them) or
// for more — so every pick equals the pick of a sequence whose state was
// replayed from exactly that history.
func TestPickNextIsAFunctionOfHistory(t *testing.T) {
	g := builtinGrammar(t, `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name"]}`, false)
	ids, err := tokenizer.NewBuiltin().Encode(`{"name":"the water", "age":12}`)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, g.Vocab.Size())
	for i := range logits {
		logits[i] = float32(r.NormFloat64())
	}
	req := Request{Grammar: g, MaxTokens: 64, Sampling: sample.Params{Temperature: 1, Seed: 9}, Logprobs: true, TopLogprobs: 2}
	sm := new(sample.Sampler)
	for j := range ids {
		exact := &sequence{req: req, allowed: make([]bool, g.Vocab.Size())}
		if exact.gram, err = g.replay(ids[:j]); err != nil {
			t.Fatal(err)
		}
		want := pickNext(sm, exact, logits, ids[:j])
		if _, ok := g.advance(exact.gram, want.id); !ok {
			t.Fatalf("after %d tokens: picked %d, which the grammar refuses", j, want.id)
		}
		for k := range len(ids) {
			seq := &sequence{req: req, allowed: make([]bool, g.Vocab.Size())}
			seq.gram, _ = g.replay(ids[:k])
			got := pickNext(sm, seq, logits, ids[:j])
			if got.id != want.id || got.logprob != want.logprob || len(got.top) != 2 || got.top[0] != want.top[0] {
				t.Fatalf("history %d, state at %d: pick %+v, want %+v", j, k, got, want)
			}
		}
	}
}

// TestGrammarAdmission: the prefix is replayed at admission; a prefix off
// the grammar, one holding the whole value, or a budget below the shortest
// value is a *GrammarError (ErrBudget for the last).
func TestGrammarAdmission(t *testing.T) {
	g := builtinGrammar(t, `{"type":"object","properties":{"a":{"type":"null"}},"required":["a"]}`, false)
	enc := func(s string) []int {
		ids, _ := tokenizer.NewBuiltin().Encode(s)
		return ids
	}
	for _, tt := range []struct {
		prefix    []int
		maxTokens int
		budget    bool
		ok        bool
	}{
		{nil, 10, false, true},
		{nil, 9, true, false}, // {"a":null} is 10 single-byte tokens at worst
		{enc(`{"a":nu`), 10, false, true},
		{enc(`{"a":nu`), 8, true, false},
		{enc(`{"b"`), 20, false, false},
	} {
		r := Request{ID: "x", Grammar: g, Prefix: tt.prefix, MaxTokens: tt.maxTokens}
		_, err := admitGrammar(&r)
		var ge *GrammarError
		if tt.ok != (err == nil) || !tt.ok && (!errors.As(err, &ge) || !errors.Is(err, ErrInvalidRequest) || errors.Is(err, ErrBudget) != tt.budget) {
			t.Errorf("prefix %v max_tokens %d: %v", tt.prefix, tt.maxTokens, err)
		}
	}
	// A prefix holding the whole value (its worker died after the closing
	// token, before its finish frame) is not an error: the caller
	// finishes the request at once.
	r := Request{ID: "x", Grammar: g, Prefix: enc(`{"a":null}`), MaxTokens: 20}
	if _, err := admitGrammar(&r); !errors.Is(err, ErrPrefixFinished) || errors.Is(err, ErrInvalidRequest) {
		t.Errorf("closed prefix: %v, want ErrPrefixFinished", err)
	}
}
