package sched

import (
	"fmt"
	"slices"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
)

// reserveLocked gives seq its blocks: the longest shared prefix, then
// fresh blocks up to need. On failure it holds nothing and the error is a
// retryable *OverloadedError.
func (s *Scheduler) reserveLocked(seq *sequence, need int) error {
	seq.blocks, seq.computed, seq.published = nil, 0, 0
	if p, ok := s.store.(kvcache.Preparer); ok && seq.req.Priority != Canary {
		// Work: its blocks may come ahead of need (no round trip each).
		p.Prepare(true)
	}
	if sh, ok := s.store.(kvcache.Sharing); ok {
		// The last prompt position is always computed: its logits pick
		// the first new token.
		bs := s.store.Layout().BlockSize
		seq.blocks = sh.AcquirePrefix(seq.tokens, (len(seq.tokens)-1)/bs)
		seq.computed = len(seq.blocks) * bs
		seq.published = len(seq.blocks)
	}
	for len(seq.blocks) < need {
		id, err := s.store.Alloc()
		if err != nil {
			s.freeLocked(seq)
			seq.computed, seq.published = 0, 0
			return &OverloadedError{Limit: LimitKVBlocks, Running: len(s.running), Queued: s.queuedLocked(), FreeBlocks: s.store.NumFree(), NeedBlocks: need}
		}
		seq.blocks = append(seq.blocks, id)
	}
	seq.reused += seq.computed
	s.reusedPositions += seq.computed
	return nil
}

// revalidateLocked recomputes, from its tokens, every sequence that holds a
// block the store took back (a shared arena whose lease lapsed): KV is
// derived state, the tokens are the facts. A sequence that cannot get
// blocks again ends with ErrKVLost.
func (s *Scheduler) revalidateLocked() {
	v, ok := s.store.(kvcache.Validator)
	if !ok {
		return
	}
	if losses := v.Losses(); losses == s.seenLosses {
		return
	} else {
		s.seenLosses = losses
	}
	for _, seq := range slices.Clone(s.running) {
		if !slices.ContainsFunc(seq.blocks, func(id kvcache.BlockID) bool { return !v.Valid(id) }) {
			continue
		}
		s.recomputed++
		need := s.blocksFor(&seq.req)
		s.freeLocked(seq)
		if err := s.reserveLocked(seq, need); err != nil {
			s.finishLocked(seq, Finish{Reason: FinishError, Err: fmt.Errorf("%w: %v", ErrKVLost, err)})
		}
	}
}

// publish offers the newly completed blocks of a step's sequences for
// reuse, a parent before its child. It runs outside the lock, while the
// sequences are in flight: a store that publishes in batches gets the
// whole step in one call (and the chance to prepare blocks for the next
// Allocs without a round trip under the lock), even when it is empty.
func (s *Scheduler) publish(seqs []*sequence) {
	sh, ok := s.store.(kvcache.Sharing)
	if !ok {
		return
	}
	if p, ok := s.store.(kvcache.Preparer); ok {
		p.Prepare(slices.ContainsFunc(seqs, func(q *sequence) bool { return q.req.Priority != Canary }))
	}
	bs := s.store.Layout().BlockSize
	var full []kvcache.FullBlock
	for _, seq := range seqs {
		for ; seq.published < seq.computed/bs; seq.published++ {
			parent := kvcache.NoBlock
			if seq.published > 0 {
				parent = seq.blocks[seq.published-1]
			}
			full = append(full, kvcache.FullBlock{ID: seq.blocks[seq.published], Parent: parent, Tokens: seq.tokens[:(seq.published+1)*bs]})
		}
	}
	if bsh, ok := sh.(kvcache.BatchSharing); ok {
		bsh.PublishBlocks(full)
		return
	}
	for _, f := range full {
		sh.Publish(f.ID, f.Parent, f.Tokens)
	}
}

func (s *Scheduler) freeLocked(seq *sequence) {
	for _, id := range seq.blocks {
		// A block we allocated is ours to free; a failure means the store
		// changed under us. Count it rather than take the engine down.
		if err := s.store.Free(id); err != nil {
			s.freeErrors++
		}
	}
	seq.blocks = nil
}
