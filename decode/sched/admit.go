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
	vocab, ctxLen := s.engine.VocabSize(), s.engine.ContextLen()
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
	case r.MaxTokens > ctxLen-len(r.Prompt):
		return bad("prompt of %d tokens plus max_tokens %d exceeds the context of %d", len(r.Prompt), r.MaxTokens, ctxLen)
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
			if id < 0 || id >= vocab {
				return bad("token %d outside the vocabulary of %d", id, vocab)
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
	if g := r.Grammar; g != nil && g.Vocab != nil && g.Vocab.Size() != vocab {
		return bad("grammar vocabulary of %d tokens, model %d", g.Vocab.Size(), vocab)
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

// Submit admits a request under the admission rule (one worker):
//
//   - it starts at once when no request of its priority or a higher one
//     waits, a slot is free and its KV blocks are (all of them, reserved up
//     front: prompt plus max_tokens);
//   - otherwise it waits in its priority's queue while the queue has room:
//     MaxQueued requests in all;
//   - otherwise it is refused with an *OverloadedError and nothing changes.
//
// Batch requests leave InteractiveReservePercent of the slots, of the KV
// blocks and of the queue to interactive ones: a batch flood never takes
// what an interactive request needs to start or to wait.
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
	seq := &sequence{req: r, tokens: slices.Concat(r.Prompt, r.Prefix), nOutput: len(r.Prefix), gram: gs, slot: -1}
	if r.Grammar != nil {
		seq.allowed = make([]bool, s.engine.VocabSize())
	}
	switch {
	case r.Priority == Canary:
		if s.canaryRunningLocked() {
			return s.overloadedLocked(LimitCanary, need)
		}
		if err := s.startLocked(seq, need); err != nil {
			return err
		}
	case s.waitingAheadLocked(r.Priority) == 0 && s.fitsLocked(r.Priority, need):
		if err := s.startLocked(seq, need); err != nil {
			return err
		}
	case s.queuedLocked() < s.queueBound(r.Priority):
		s.queues[r.Priority] = append(s.queues[r.Priority], seq)
	default:
		limit := LimitQueued
		if s.queueBound(r.Priority) == 0 {
			limit = LimitKVBlocks
			if s.regularRunningLocked() >= s.runningBound(r.Priority) {
				limit = LimitRunning
			}
		}
		return s.overloadedLocked(limit, need)
	}
	s.byID[r.ID] = seq
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

func (s *Scheduler) overloadedLocked(limit Limit, need int) error {
	return &OverloadedError{Limit: limit, Running: len(s.running), Queued: s.queuedLocked(), FreeBlocks: s.store.NumFree(), NeedBlocks: need}
}

// InteractiveReservePercent is the share of a worker's slots, KV blocks and
// queue that batch requests leave to interactive ones.
const InteractiveReservePercent = 25

// Capacity is the most requests of priority p a scheduler with limits l
// holds at once, running and queued: the one beyond it is refused as
// overloaded (a router that counts its own open streams on a worker
// sends it no more).
func (l Limits) Capacity(p Priority) int {
	return l.MaxRunning - reserve(p, l.MaxRunning) + l.MaxQueued - reserve(p, l.MaxQueued)
}

// reserve is the part of total that batch requests leave alone.
func reserve(p Priority, total int) int {
	if p != Batch {
		return 0
	}
	return total * InteractiveReservePercent / 100
}

// runningBound is the most regular sequences running once one of p starts.
func (s *Scheduler) runningBound(p Priority) int {
	return s.limits.MaxRunning - reserve(p, s.limits.MaxRunning)
}

// queueBound is the most requests queued, all priorities together, below
// which one of p may still queue.
func (s *Scheduler) queueBound(p Priority) int {
	return s.limits.MaxQueued - reserve(p, s.limits.MaxQueued)
}

// fitsLocked reports whether a request of p needing need blocks can start
// now: a slot and the blocks are free, outside the canary's blocks and,
// for batch, outside the interactive reserve.
func (s *Scheduler) fitsLocked(p Priority, need int) bool {
	free := s.store.NumFree() - s.canaryReserveLocked() - reserve(p, s.store.Capacity())
	return s.regularRunningLocked() < s.runningBound(p) && free >= need
}

// waitingAheadLocked counts the queued requests of priority p or a higher
// one: a new request of p queues behind them.
func (s *Scheduler) waitingAheadLocked(p Priority) int {
	n := 0
	for q := range s.queues {
		if Priority(q).rank() <= p.rank() {
			n += len(s.queues[q])
		}
	}
	return n
}

// QueuePosition is where the request id waits in the queue (1: next to
// start), or 0 when it is not queued (running, finished or unknown).
func (s *Scheduler) QueuePosition(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq, ok := s.byID[id]
	if !ok {
		return 0
	}
	p := seq.req.Priority
	if i := slices.Index(s.queues[p], seq); i >= 0 {
		return s.waitingAheadLocked(p) - len(s.queues[p]) + i + 1
	}
	return 0
}

func (s *Scheduler) startLocked(seq *sequence, need int) error {
	if err := s.reserveLocked(seq, need); err != nil {
		return err
	}
	s.startSlotLocked(seq)
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
// interactive request is not overtaken forever (nor by batch ones).
func (s *Scheduler) admitLocked() {
	for p := range s.queues {
		for len(s.queues[p]) > 0 {
			seq := s.queues[p][0]
			need := s.blocksFor(&seq.req)
			if !s.fitsLocked(Priority(p), need) {
				return
			}
			if err := s.startLocked(seq, need); err != nil {
				return
			}
			s.queues[p] = s.queues[p][1:]
		}
	}
}
