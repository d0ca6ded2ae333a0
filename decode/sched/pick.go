package sched

import "github.com/lifeline-llm/lifeline/decode/sample"

// pick is the token chosen at one output position, with what the request
// asked to learn about the choice.
type pick struct {
	id int
}

// pickNext chooses seq's token after the output tokens history from the
// logits of that position. It is the one place a token is chosen (plain
// decoding, and the verification of speculated tokens), a pure function of
// its arguments and seq's request, so that any continuation from a prefix
// chooses exactly what the uninterrupted run chose.
func pickNext(sm *sample.Sampler, seq *sequence, logits []float32, history []int) pick {
	r := &seq.req
	return pick{id: sm.Sample(logits, r.Sampling, history, uint64(len(history)+1))}
}
