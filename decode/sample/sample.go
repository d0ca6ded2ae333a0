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
}

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
	cand   []candidate
	counts map[int]int
}

// Sample returns the token for 1-based output position (sequence number)
// position, given the logits of that position and the output tokens before
// it. The result depends only on its arguments.
func (s *Sampler) Sample(logits []float32, p Params, history []int, position uint64) int {
	s.cand = s.cand[:0]
	for id, l := range logits {
		s.cand = append(s.cand, candidate{id: id, logit: float64(l)})
	}
	if (p.FrequencyPenalty != 0 || p.PresencePenalty != 0) && len(history) > 0 {
		if s.counts == nil {
			s.counts = make(map[int]int)
		}
		clear(s.counts)
		for _, id := range history {
			s.counts[id]++
		}
		for id, n := range s.counts {
			if id >= 0 && id < len(s.cand) {
				s.cand[id].logit -= float64(n)*p.FrequencyPenalty + p.PresencePenalty
			}
		}
	}
	if p.Temperature == 0 {
		best := 0
		for i, c := range s.cand {
			if c.logit > s.cand[best].logit {
				best = i
			}
		}
		return s.cand[best].id
	}
	// Most likely first, lowest id first among equals: a total order, so
	// the cut-offs below never depend on sort stability.
	slices.SortFunc(s.cand, func(a, b candidate) int {
		switch {
		case a.logit > b.logit:
			return -1
		case a.logit < b.logit:
			return 1
		}
		return a.id - b.id
	})
	c := s.cand
	if p.TopK > 0 && p.TopK < len(c) {
		c = c[:p.TopK]
	}
	top := c[0].logit
	var sum float64
	for i := range c {
		c[i].prob = math.Exp((c[i].logit - top) / p.Temperature)
		sum += c[i].prob
	}
	if p.TopP > 0 && p.TopP < 1 {
		var cum float64
		for i := range c {
			cum += c[i].prob / sum
			if cum >= p.TopP {
				c = c[:i+1]
				break
			}
		}
		sum = 0
		for i := range c {
			sum += c[i].prob
		}
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
