package sched

import (
	"slices"

	"github.com/lifeline-llm/lifeline/decode/sample"
)

// pick is the token chosen at one output position, with what the request
// asked to learn about the choice.
type pick struct {
	id int
	// logprob and top are the token's log-probability and the most likely
	// tokens, when the request asked for logprobs.
	logprob float64
	top     []sample.TopLogprob
	// stuck: the grammar allowed no token at all (a vocabulary without
	// single-byte tokens); the sequence ends with ErrNoAllowedToken.
	stuck bool
}

// pickNext chooses seq's token after the output tokens history from the
// logits of that position. It is the one place a token is chosen (plain
// decoding, and the verification of speculated tokens), a pure function of
// its arguments and seq's request, so that any continuation from a prefix
// chooses exactly what the uninterrupted run chose.
//
// A structured request's logits are masked by its grammar at the state
// after history (seq's state for the delivered tokens, advanced over any
// further ones), under the budget of tokens left; logprobs are those of
// the raw logits, computed only when asked.
func pickNext(sm *sample.Sampler, seq *sequence, logits []float32, history []int) pick {
	r := &seq.req
	pos := uint64(len(history) + 1)
	var p pick
	if g := r.Grammar; g != nil && g.mask(seq.gramAt(history), r.MaxTokens-len(history), seq.allowed) {
		if !slices.Contains(seq.allowed, true) {
			return pick{stuck: true}
		}
		p.id = sm.SampleAllowed(logits, r.Sampling, history, pos, seq.allowed)
	} else {
		p.id = sm.Sample(logits, r.Sampling, history, pos)
	}
	if r.Logprobs {
		p.logprob, p.top = sample.Logprobs(logits, p.id, r.TopLogprobs, nil)
	}
	return p
}

// gramAt is seq's grammar state after the output tokens history: the
// state of its delivered tokens advanced over the rest (a verifier's
// speculated tokens), or replayed when history is shorter.
func (seq *sequence) gramAt(history []int) gramState {
	g := seq.req.Grammar
	gs := seq.gram
	if gs.at > len(history) {
		gs, _ = g.replay(history)
		return gs
	}
	for _, id := range history[gs.at:] {
		gs, _ = g.advance(gs, id) // a refused token is never committed: its pick differs
	}
	return gs
}
