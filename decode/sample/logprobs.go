package sample

import "math"

// MaxTopLogprobs bounds how many alternatives Logprobs reports.
const MaxTopLogprobs = 20

// TopLogprob is one of the most likely tokens at a position.
type TopLogprob struct {
	ID      int
	Logprob float64
}

// Logprobs returns the log-probability of token id and the top most likely
// tokens (most likely first, ties by lower id) under the log-softmax of the
// raw logits, in float64: before logit bias, penalties, temperature,
// cut-offs and any mask, so a pure function of the logits. top is clamped
// to 0..MaxTopLogprobs; out is reused for the result.
func Logprobs(logits []float32, id, top int, out []TopLogprob) (float64, []TopLogprob) {
	top = min(max(top, 0), MaxTopLogprobs, len(logits))
	hi := math.Inf(-1)
	for _, v := range logits {
		hi = max(hi, float64(v))
	}
	var sum float64
	for _, v := range logits { // id order: the sum is the same every time
		sum += math.Exp(float64(v) - hi)
	}
	lse := hi + math.Log(sum)
	out = out[:0]
	for i, v := range logits {
		if len(out) == top && (top == 0 || !better(float64(v), i, out[top-1])) {
			continue
		}
		// Insert in order (top is small), dropping the last when full.
		if len(out) < top {
			out = append(out, TopLogprob{})
		}
		j := len(out) - 1
		for ; j > 0 && better(float64(v), i, out[j-1]); j-- {
			out[j] = out[j-1]
		}
		out[j] = TopLogprob{ID: i, Logprob: float64(v)}
	}
	for i := range out {
		out[i].Logprob -= lse
	}
	return float64(logits[id]) - lse, out
}

// better orders by raw logit, higher first, then by lower id; t.Logprob
// still holds a raw logit.
func better(v float64, id int, t TopLogprob) bool {
	return v > t.Logprob || v == t.Logprob && id < t.ID
}
