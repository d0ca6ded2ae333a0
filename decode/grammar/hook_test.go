package grammar

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/sample"
)

// generate runs the engine's sampler under the mask from the output
// prefix done: logits are a pure function of (logit seed, position), as
// the engine's are of the token prefix, so a run resumed from any prefix
// (its state replayed) must continue exactly as the uninterrupted one.
func generate(t *testing.T, a *Automaton, v *Vocab, pieces [][]byte, p sample.Params, budget int, done []int) []int {
	out := slices.Clone(done)
	tokens := make([][]byte, len(done))
	for i, id := range done {
		tokens[i] = pieces[id]
	}
	s, err := a.Replay(tokens)
	if err != nil {
		t.Fatal(err)
	}
	var sm sample.Sampler
	allowed := make([]bool, v.Size())
	logits := make([]float32, v.Size())
	for len(out) < budget {
		r := rand.New(rand.NewPCG(p.Seed, uint64(len(out))))
		for i := range logits {
			logits[i] = float32(r.NormFloat64() * 2)
		}
		a.MaskBudget(s, v, allowed, budget-len(out))
		id := sm.SampleAllowed(logits, p, out, uint64(len(out)+1), allowed)
		if id == v.eos {
			break
		}
		var ok bool
		if s, ok = a.Advance(s, pieces[id]); !ok {
			t.Fatalf("sampled %q, refused", pieces[id])
		}
		out = append(out, id)
	}
	return out
}

// TestSamplerHookResumesBitIdentically: masked sampling through
// sample.SampleAllowed yields valid JSON, and a continuation from any
// prefix, with the automaton replayed, reproduces the tokens.
func TestSamplerHookResumesBitIdentically(t *testing.T) {
	v, pieces := builtinVocab()
	r := rand.New(rand.NewPCG(5, 5))
	cases := 60
	if testing.Short() {
		cases = 15
	}
	for i := range cases {
		raw := randomObject(r, 1)
		schema, _ := json.Marshal(raw)
		a := mustCompile(t, string(schema))
		p := sample.Params{Temperature: 0.9, TopP: 0.95, Seed: uint64(i)}
		budget := a.MinClose(a.Start()) + 20
		ids := generate(t, a, v, pieces, p, budget, nil)
		out := joinPieces(pieces, ids)
		val, err := decodeNumbers(out)
		if err != nil {
			t.Fatalf("schema %s: %q: %v", schema, out, err)
		}
		if err := validate(raw, val); err != nil {
			t.Fatalf("schema %s: %q: %v", schema, out, err)
		}
		k := r.IntN(len(ids) + 1)
		if got := generate(t, a, v, pieces, p, budget, ids[:k]); !slices.Equal(got, ids) {
			t.Fatalf("schema %s: resumed at %d: %q, want %q", schema, k, joinPieces(pieces, got), out)
		}
	}
}
