// Package sample picks the next token from logits. It has no hidden state:
// the random draw for output position p is a pure function of (seed, p), and
// penalties are computed from the output tokens so far, so a continuation
// from any prefix picks exactly what the uninterrupted run picked.
package sample

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
)

// ErrInvalidParams is wrapped by every parameter validation error.
var ErrInvalidParams = errors.New("sample: invalid parameters")

// Params are the sampling parameters of one request.
type Params struct {
	// Temperature 0 means greedy: the highest logit, lowest id on ties.
	Temperature float64
	// TopK keeps the K most likely tokens; 0 keeps all.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// reaches TopP; 0 or 1 keeps all.
	TopP float64
	// FrequencyPenalty and PresencePenalty follow OpenAI: a token's logit is
	// lowered by count*FrequencyPenalty + (count>0)*PresencePenalty, counting
	// its occurrences among the output tokens so far.
	FrequencyPenalty float64
	PresencePenalty  float64
	Seed             uint64
	// LogitBias adds its value (-100..100) to the logit of each token id
	// it names before anything else, as OpenAI's logit_bias does: -100
	// bans a token, 100 all but forces it.
	LogitBias map[int]float64
}

// MaxLogitBias bounds a LogitBias value either way.
const MaxLogitBias = 100

// Validate reports the first out-of-range field by name.
func (p Params) Validate() error {
	switch {
	case math.IsNaN(p.Temperature) || p.Temperature < 0 || p.Temperature > 100:
		return fmt.Errorf("%w: temperature %v (want 0..100)", ErrInvalidParams, p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("%w: top_k %d (want >= 0)", ErrInvalidParams, p.TopK)
	case math.IsNaN(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return fmt.Errorf("%w: top_p %v (want 0..1)", ErrInvalidParams, p.TopP)
	case math.IsNaN(p.FrequencyPenalty) || math.Abs(p.FrequencyPenalty) > 2:
		return fmt.Errorf("%w: frequency_penalty %v (want -2..2)", ErrInvalidParams, p.FrequencyPenalty)
	case math.IsNaN(p.PresencePenalty) || math.Abs(p.PresencePenalty) > 2:
		return fmt.Errorf("%w: presence_penalty %v (want -2..2)", ErrInvalidParams, p.PresencePenalty)
	}
	for id, b := range p.LogitBias {
		if id < 0 || math.IsNaN(b) || math.Abs(b) > MaxLogitBias {
			return fmt.Errorf("%w: logit_bias %d: %v (want a token id and -100..100)", ErrInvalidParams, id, b)
		}
	}
	return nil
}

// Uniform is the counter-based generator: a value in [0, 1) that depends
// only on (seed, position), built from two SplitMix64 finalisers.
func Uniform(seed, position uint64) float64 {
	z := mix64(mix64(seed^0x6a09e667f3bcc909) ^ (position * 0x9e3779b97f4a7c15))
	return float64(z>>11) * 0x1p-53
}

func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

type candidate struct {
	id    int
	logit float64
	prob  float64
}

// Sampler holds scratch buffers; it carries no state from one call to the
// next. The zero value is ready; it is not safe for concurrent use.
type Sampler struct {
	logits []float64
	cum    []float64
	keys   []uint64
	cand   []candidate
	counts map[int]int
	// Parallel, when set, runs f(0) … f(n-1), each once, on several
	// goroutines: a draw over a large vocabulary computes its weights in
	// parts on them (each weight is computed alone; the sum stays in id
	// order), which changes no bit of the result.
	Parallel func(n int, f func(part int))
}

// parallelDraw is the vocabulary from which a draw over every id splits
// its weights across Parallel: 32,000 float64 exponentials are a large
// part of a batch-1 token.
const parallelDraw = 8192

// orderKey sorts ascending as (logit descending, id ascending). Logits are
// compared at float32 precision; ties at that precision fall to the id, so
// the order stays total and deterministic.
func orderKey(logit float64, id int) uint64 {
	b := math.Float32bits(float32(logit))
	if b&(1<<31) != 0 {
		b = ^b
	} else {
		b |= 1 << 31
	}
	return uint64(^b)<<32 | uint64(uint32(id))
}

// Sample returns the token for 1-based output position (sequence number)
// position, given the logits of that position and the output tokens before
// it. The result depends only on its arguments.
func (s *Sampler) Sample(logits []float32, p Params, history []int, position uint64) int {
	return s.sample(s.widen(logits), p, history, position)
}

// SampleAllowed is Sample restricted to the ids with allowed[id] true (a
// structured-output mask, e.g. from decode/grammar): the others are cut
// before penalties, temperature and the cut-offs, so the draw is still a
// pure function of the arguments. allowed must cover the logits and
// allow at least one id.
func (s *Sampler) SampleAllowed(logits []float32, p Params, history []int, position uint64, allowed []bool) int {
	l := s.widen(logits)
	for id := range l {
		if !allowed[id] {
			l[id] = math.Inf(-1)
		}
	}
	id := s.sample(l, p, history, position)
	if !allowed[id] {
		// Only rounding at the top of the cumulative sum lands here:
		// fall back, deterministically, to the best allowed id.
		id = argmax(l)
	}
	return id
}

func (s *Sampler) sample(l []float64, p Params, history []int, position uint64) int {
	for id, b := range p.LogitBias { // additive per id: the order does not matter
		if id < len(l) {
			l[id] += b
		}
	}
	if (p.FrequencyPenalty != 0 || p.PresencePenalty != 0) && len(history) > 0 {
		s.penalize(l, p, history)
	}
	if p.Temperature == 0 {
		return argmax(l)
	}
	if p.TopK == 0 && (p.TopP == 0 || p.TopP == 1) {
		return s.drawAll(l, p, position)
	}
	c := s.ranked(l)
	if p.TopK > 0 && p.TopK < len(c) {
		c = c[:p.TopK]
	}
	sum := weigh(c, p.Temperature)
	if p.TopP > 0 && p.TopP < 1 {
		c, sum = nucleus(c, sum, p.TopP)
	}
	u := Uniform(p.Seed, position) * sum
	var cum float64
	for i := range c {
		cum += c[i].prob
		if u < cum {
			return c[i].id
		}
	}
	return c[len(c)-1].id
}

// widen copies logits into the float64 scratch buffer.
func (s *Sampler) widen(logits []float32) []float64 {
	l := slices.Grow(s.logits[:0], len(logits))[:len(logits)]
	for i, v := range logits {
		l[i] = float64(v)
	}
	s.logits = l
	return l
}

// penalize lowers each logit by the frequency and presence penalties of
// its token's occurrences in history.
func (s *Sampler) penalize(l []float64, p Params, history []int) {
	if s.counts == nil {
		s.counts = make(map[int]int)
	}
	clear(s.counts)
	for _, id := range history {
		s.counts[id]++
	}
	for id, n := range s.counts {
		if id >= 0 && id < len(l) {
			l[id] -= float64(n)*p.FrequencyPenalty + p.PresencePenalty
		}
	}
}

// argmax is the greedy pick: the highest logit, lowest id on ties.
func argmax(l []float64) int {
	best := 0
	for i, v := range l {
		if v > l[best] {
			best = i
		}
	}
	return best
}

// drawAll draws over every id in id order when nothing is cut off, so no
// sort is needed. It overwrites l with the unnormalised weights.
func (s *Sampler) drawAll(l []float64, p Params, position uint64) int {
	top := topOf(l)
	if s.Parallel != nil && len(l) >= parallelDraw {
		const parts = 4
		chunk := (len(l) + parts - 1) / parts
		s.Parallel(parts, func(part int) {
			weighAll(l[min(part*chunk, len(l)):min((part+1)*chunk, len(l))], top, p.Temperature)
		})
	} else {
		weighAll(l, top, p.Temperature)
	}
	// The pick is the first id whose running sum of weights, in id order,
	// exceeds u; the running sums are kept, so it is found by bisection.
	cum := slices.Grow(s.cum[:0], len(l))[:len(l)]
	var sum float64
	for i, w := range l {
		sum += w
		cum[i] = sum
	}
	s.cum = cum
	u := Uniform(p.Seed, position) * sum
	if !(u < sum) { // u rounded up to the sum, or a NaN logit
		return len(l) - 1
	}
	// No weight is negative, and none is NaN since the sum is not: the
	// running sums never decrease.
	return sort.Search(len(cum), func(i int) bool { return u < cum[i] })
}

// topOf is the largest of l, NaN if any is: max's fold over l, except that
// it may pick -0 where max picks +0, which changes no weight (x − ±0 is x,
// and the weight of ±0 is 1).
func topOf(l []float64) float64 {
	top, nan := l[0], false
	for _, v := range l {
		if v > top {
			top = v
		}
		if v != v {
			nan = true
		}
	}
	if nan {
		return math.NaN()
	}
	return top
}

// ranked returns every id as a candidate, most likely first and lowest id
// first among equals: a total order, so the cut-offs never depend on sort
// stability.
func (s *Sampler) ranked(l []float64) []candidate {
	s.keys = s.keys[:0]
	for id, v := range l {
		s.keys = append(s.keys, orderKey(v, id))
	}
	slices.Sort(s.keys)
	c := s.cand[:0]
	for _, k := range s.keys {
		id := int(uint32(k))
		c = append(c, candidate{id: id, logit: l[id]})
	}
	s.cand = c
	return c
}

// weigh sets each candidate's unnormalised probability at temperature and
// returns their sum.
func weigh(c []candidate, temperature float64) float64 {
	top := c[0].logit
	for i := range c {
		top = max(top, c[i].logit)
	}
	var sum float64
	for i := range c {
		c[i].prob = expWeight((c[i].logit - top) / temperature)
		sum += c[i].prob
	}
	return sum
}

// nucleus keeps the shortest ranked prefix of c whose probability reaches
// topP and returns it with its unnormalised sum.
func nucleus(c []candidate, sum, topP float64) ([]candidate, float64) {
	var cum float64
	for i := range c {
		cum += c[i].prob / sum
		if cum >= topP {
			c = c[:i+1]
			break
		}
	}
	sum = 0
	for i := range c {
		sum += c[i].prob
	}
	return c, sum
}
