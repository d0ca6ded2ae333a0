package sched

import (
	"errors"
	"fmt"
	"slices"

	"github.com/lifeline-llm/lifeline/decode/sample"
)

// blocksFor is the number of blocks a request reserves: every position up to
// the last one whose K/V is computed (the final token is never fed back).
func (s *Scheduler) blocksFor(r *Request) int {
	positions := len(r.Prompt) + r.MaxTokens - 1
	if r.PrefillOnly {
		positions = len(r.Prompt)
	}
	bs := s.store.Layout().BlockSize
	return (positions + bs - 1) / bs
}

func (s *Scheduler) validate(r *Request) error {
	c := s.model.Config
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: request %q: %s", ErrInvalidRequest, r.ID, fmt.Sprintf(format, args...))
	}
	switch {
	case r.ID == "":
		return bad("empty id")
	case len(r.Prompt) == 0:
		return bad("empty prompt")
	case r.MaxTokens <= 0:
		return bad("max_tokens %d must be positive", r.MaxTokens)
	case len(r.Prefix) >= r.MaxTokens:
		return bad("prefix of %d tokens leaves nothing to generate within max_tokens %d", len(r.Prefix), r.MaxTokens)
	case r.MaxTokens > c.ContextLen-len(r.Prompt):
		return bad("prompt of %d tokens plus max_tokens %d exceeds the context of %d", len(r.Prompt), r.MaxTokens, c.ContextLen)
	case r.Priority < 0 || r.Priority >= numPriorities:
		return bad("priority %d", r.Priority)
	case r.Priority == Canary && len(r.Prompt)+r.MaxTokens > CanaryMaxPositions:
		return bad("a canary may use at most %d positions", CanaryMaxPositions)
	case r.OnToken == nil || r.OnFinish == nil:
		return bad("OnToken and OnFinish are required")
	case r.PrefillOnly && len(r.Prefix) > 0:
		// A prefill hands off the prompt's blocks; a continuation is a
		// decode's work (its blocks would not be reserved here).
		return bad("prefill_only takes no prefix tokens")
	}
	for _, ids := range [][]int{r.Prompt, r.Prefix} {
		for _, id := range ids {
			if id < 0 || id >= c.VocabSize {
				return bad("token %d outside the vocabulary of %d", id, c.VocabSize)
			}
		}
	}
	for _, id := range r.Prefix {
		if slices.Contains(r.StopTokens, id) {
			return bad("prefix contains stop token %d", id)
		}
	}
	if err := r.Sampling.Validate(); err != nil {
		return bad("%v", err)
	}
	if r.TopLogprobs < 0 || r.TopLogprobs > sample.MaxTopLogprobs {
		return bad("top_logprobs %d (want 0..%d)", r.TopLogprobs, sample.MaxTopLogprobs)
	}
	if g := r.Grammar; g != nil && g.Vocab != nil && g.Vocab.Size() != c.VocabSize {
		return bad("grammar vocabulary of %d tokens, model %d", g.Vocab.Size(), c.VocabSize)
	}
	return nil
}

// admitGrammar returns a structured request's state after its prefix, or
// the refusal: a *GrammarError.
func admitGrammar(r *Request) (gramState, error) {
	if r.Grammar == nil || r.PrefillOnly {
		return gramState{}, nil
	}
	gs, err := r.Grammar.admit(r)
	if errors.Is(err, ErrPrefixFinished) {
		return gs, fmt.Errorf("request %q: %w", r.ID, err)
	}
	if err != nil {
		return gs, &GrammarError{ID: r.ID, Err: err}
	}
	return gs, nil
}

// Submit admits a request, starting it at once when a slot and its KV
// blocks are free and queueing it otherwise. When neither is possible it
// returns an *OverloadedError and changes nothing.
func (s *Scheduler) Submit(r Request) error {
	if err := s.validate(&r); err != nil {
		return err
	}
	gs, err := admitGrammar(&r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if _, dup := s.byID[r.ID]; dup {
		return fmt.Errorf("%w: request %q: id already in use", ErrInvalidRequest, r.ID)
	}
	need := s.blocksFor(&r)
	if need > s.store.Capacity() {
		return fmt.Errorf("%w: request %q needs %d blocks of %d", ErrTooLarge, r.ID, need, s.store.Capacity())
	}
	seq := &sequence{req: r, tokens: slices.Concat(r.Prompt, r.Prefix), nOutput: len(r.Prefix), gram: gs}
	if r.Grammar != nil {
		seq.allowed = make([]bool, s.model.Config.VocabSize)
	}
	if r.Priority == Canary {
		if s.canaryRunningLocked() {
			return &OverloadedError{Limit: LimitCanary, Running: len(s.running), Queued: s.queuedLocked(), FreeBlocks: s.store.NumFree(), NeedBlocks: need}
		}
		if err := s.startLocked(seq, need); err != nil {
			return err
		}
	} else if s.queuedLocked() == 0 && s.regularRunningLocked() < s.limits.MaxRunning && s.store.NumFree()-s.canaryReserveLocked() >= need {
		if err := s.startLocked(seq, need); err != nil {
			return err
		}
	} else if s.queuedLocked() < s.limits.MaxQueued {
		s.queues[r.Priority] = append(s.queues[r.Priority], seq)
	} else {
		limit := LimitQueued
		if s.limits.MaxQueued == 0 {
			limit = LimitKVBlocks
			if s.regularRunningLocked() >= s.limits.MaxRunning {
				limit = LimitRunning
			}
		}
		return &OverloadedError{Limit: limit, Running: len(s.running), Queued: s.queuedLocked(), FreeBlocks: s.store.NumFree(), NeedBlocks: need}
	}
	s.byID[r.ID] = seq
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

func (s *Scheduler) startLocked(seq *sequence, need int) error {
	if err := s.reserveLocked(seq, need); err != nil {
		return err
	}
	s.running = append(s.running, seq)
	return nil
}

func (s *Scheduler) canaryRunningLocked() bool {
	return slices.ContainsFunc(s.running, func(q *sequence) bool { return q.req.Priority == Canary })
}

func (s *Scheduler) regularRunningLocked() int {
	n := len(s.running)
	if s.canaryRunningLocked() {
		n--
	}
	return n
}

// canaryReserveLocked is the number of free blocks regular traffic must
// leave for a canary that is not running yet.
func (s *Scheduler) canaryReserveLocked() int {
	if s.canaryRunningLocked() {
		return 0
	}
	bs := s.store.Layout().BlockSize
	return (CanaryMaxPositions + bs - 1) / bs
}

// admitLocked starts queued requests in priority order while slots and
// blocks last; it stops at the first that does not fit so that a large
// interactive request is not overtaken forever.
func (s *Scheduler) admitLocked() {
	for p := range s.queues {
		for len(s.queues[p]) > 0 && s.regularRunningLocked() < s.limits.MaxRunning {
			seq := s.queues[p][0]
			need := s.blocksFor(&seq.req)
			if s.store.NumFree()-s.canaryReserveLocked() < need {
				return
			}
			if err := s.startLocked(seq, need); err != nil {
				return
			}
			s.queues[p] = s.queues[p][1:]
		}
	}
}
