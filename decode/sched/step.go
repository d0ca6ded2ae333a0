package sched

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/lifeline-llm/lifeline/decode/matmul"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
)

// Step admits what fits and runs one forward pass over the running
// sequences. It reports whether there was anything to do. The scheduler's
// lock is not held during the forward pass and sampling, so Submit, Stats
// and Cancel of sequences outside the batch answer at once; Cancel of a
// sequence inside the batch waits for the step to end, because its blocks
// are being written.
func (s *Scheduler) Step() (bool, error) {
	s.stepMu.Lock()
	defer s.stepMu.Unlock()

	s.mu.Lock()
	s.revalidateLocked()
	s.admitLocked()
	s.restoreLocked()
	if len(s.running) == 0 {
		s.mu.Unlock()
		return false, nil
	}
	b := s.planLocked()
	s.mu.Unlock()

	// Unlocked: nobody else touches the batch's sequences until inFlight
	// is cleared (Cancel waits for it).
	began := time.Now()
	s.propose(b.in, b.spec)
	err := s.engine.Forward(s.store, b.in)
	var picks []pick
	if err == nil {
		s.publish(b.seqs)
		s.save(b.seqs)
		picks = s.sampleAll(b.sampled)
		s.verifyAll(b.spec)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.stepDone.Broadcast()
	// A paced step (SetStepInterval) takes the interval as the streams
	// see it: that is what a drain's and a canary's allowances are for.
	s.stepTimes[s.stepCount%meanSteps] = max(time.Since(began), time.Duration(s.interval.Load()))
	s.stepCount++
	if err == nil {
		s.computed += uint64(len(b.in))
	}
	return true, s.commitLocked(b, picks, err)
}

// stepBatch is the work of one step.
type stepBatch struct {
	in []model.Input
	// seqs are the sequences computed, marked inFlight; sampled are those
	// whose last position is in the batch, in the order of their logits.
	seqs, sampled []*sequence
	// spec are the speculated sequences (also in seqs, not in sampled).
	spec []*specRun
}

// planLocked fills one step's token budget, highest priority first: a
// prefill longer than the budget left is cut into a chunk, and a sequence
// whose last token is in the batch gets its logits computed for sampling.
func (s *Scheduler) planLocked() stepBatch {
	order := slices.Clone(s.running)
	slices.SortStableFunc(order, func(a, b *sequence) int { return a.req.Priority.rank() - b.req.Priority.rank() })
	budget := s.limits.MaxStepTokens
	var b stepBatch
	vocab := s.engine.VocabSize()
	for _, seq := range order {
		if budget == 0 {
			break
		}
		if k := s.specWidthLocked(seq, budget); k > 0 {
			budget -= s.planSpecLocked(&b, seq, k)
			continue
		}
		remaining := len(seq.tokens) - seq.computed
		chunk := min(remaining, budget)
		budget -= chunk
		for p := seq.computed; p < seq.computed+chunk; p++ {
			inp := model.Input{Token: seq.tokens[p], Pos: p, Blocks: seq.blocks, Seq: seq.slot}
			if p == len(seq.tokens)-1 && !seq.req.PrefillOnly {
				if seq.logits == nil {
					seq.logits = make([]float32, vocab)
				}
				inp.Logits = seq.logits
				b.sampled = append(b.sampled, seq)
			}
			b.in = append(b.in, inp)
		}
		seq.computed += chunk
		seq.inFlight = true
		b.seqs = append(b.seqs, seq)
	}
	return b
}

// commitLocked ends the step of b: a failed forward pass (err) ends the
// whole batch; otherwise cancellations asked for during the step take
// effect, finished prefills end, and every sampled token picks[i] is
// delivered.
func (s *Scheduler) commitLocked(b stepBatch, picks []pick, err error) error {
	for _, seq := range b.seqs {
		seq.inFlight = false
	}
	if err != nil {
		s.stepErrors++
		for _, seq := range b.seqs {
			s.finishLocked(seq, Finish{Reason: FinishError, Err: err})
		}
		return fmt.Errorf("sched: step: %w", err)
	}
	for _, seq := range b.seqs {
		if seq.cancelled {
			s.finishLocked(seq, Finish{Reason: FinishCancelled, Err: ErrCancelled})
		}
	}
	for _, seq := range b.seqs {
		if seq.req.PrefillOnly && !seq.finished && seq.computed == len(seq.tokens) {
			s.finishLocked(seq, Finish{Reason: FinishPrefilled})
		}
	}
	for i, seq := range b.sampled {
		if !seq.finished {
			s.deliverLocked(seq, picks[i])
		}
	}
	for _, r := range b.spec {
		if !r.seq.finished {
			s.commitSpecLocked(r)
		}
	}
	return nil
}

// deliverLocked appends the sampled token to seq, hands it to OnToken,
// and ends seq on a stop token, when its structured value closed, when
// OnToken declines more, or when its budget is spent.
func (s *Scheduler) deliverLocked(seq *sequence, p pick) {
	r := &seq.req
	if p.stuck {
		s.finishLocked(seq, Finish{Reason: FinishError, Err: ErrNoAllowedToken})
		return
	}
	id := p.id
	pos := seq.nOutput + 1
	seq.tokens = append(seq.tokens, id)
	seq.nOutput++
	s.generated++
	tok := Token{SequenceNo: pos, ID: id, Logprob: p.logprob, TopLogprobs: p.top}
	if r.KeepLogits {
		tok.Logits = slices.Clone(seq.logits)
	}
	if g := r.Grammar; g != nil {
		seq.gram, _ = g.advance(seq.gram, id) // the mask allowed id
		tok.Closed = g.closed(seq.gram)
	}
	stop := slices.Contains(r.StopTokens, id) || tok.Closed
	tok.Last = stop || seq.nOutput >= r.MaxTokens
	more := r.OnToken(tok)
	switch {
	case stop || !more:
		s.finishLocked(seq, Finish{Reason: FinishStop})
	case seq.nOutput >= r.MaxTokens:
		s.finishLocked(seq, Finish{Reason: FinishLength})
	}
}

// sampleAll picks the next token of every sequence. Sampling is a pure
// function of its inputs, so the sequences are split across goroutines.
func (s *Scheduler) sampleAll(seqs []*sequence) []pick {
	picks := make([]pick, len(seqs))
	workers := min(runtime.GOMAXPROCS(0), (len(seqs)+3)/4)
	for len(s.samplers) < workers {
		s.samplers = append(s.samplers, new(sample.Sampler))
	}
	sampleFrom := func(w int) {
		for i := w; i < len(seqs); i += workers {
			seq := seqs[i]
			picks[i] = pickNext(s.samplers[w], seq, seq.logits, seq.tokens[len(seq.req.Prompt):])
		}
	}
	// One sampler alone computes a large vocabulary's weights on every
	// core; several already run one per core.
	par := matmul.Parallel
	if workers > 1 {
		par = nil
	}
	for _, sm := range s.samplers[:workers] {
		sm.Parallel = par
	}
	if workers == 1 {
		sampleFrom(0) // small batches: no goroutine per step
		return picks
	}
	matmul.Parallel(workers, sampleFrom)
	return picks
}
