package sched

import (
	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
)

// Engine is the seam between the scheduler and what computes: one call
// per step writes every input's K/V into its sequence's KV and fills the
// logits asked for. Everything else — admission, batching, sampling,
// grammars, logprobs, stops, speculation — is the scheduler's.
//
// The reference model (New) keeps K/V in the store's blocks, addressed by
// Input.Blocks. An engine that keeps K/V itself (llama.cpp: NewOn with a
// store that only counts blocks) addresses it by Input.Seq, the
// sequence's slot: slots run from 0 to Limits.MaxRunning (a canary may
// run beside a full house), and an input at position p of a slot
// discards what the slot held at p and after (a sequence that starts
// over, or a new one in a slot that served another).
type Engine interface {
	Forward(store kvcache.Store, in []model.Input) error
	VocabSize() int
	ContextLen() int
}

// Slots is how many sequence slots an Engine must hold for limits.
func (l Limits) Slots() int { return l.MaxRunning + 1 }

// modelEngine is the reference model as an Engine.
type modelEngine struct {
	m  *model.Model
	ws model.Workspace
}

func (e *modelEngine) Forward(store kvcache.Store, in []model.Input) error {
	return e.m.Forward(&e.ws, store, in)
}

func (e *modelEngine) VocabSize() int  { return e.m.Config.VocabSize }
func (e *modelEngine) ContextLen() int { return e.m.Config.ContextLen }

// takeSlotLocked gives seq the lowest free slot.
func (s *Scheduler) takeSlotLocked(seq *sequence) {
	for i, used := range s.slots {
		if !used {
			s.slots[i], seq.slot = true, i
			return
		}
	}
	s.slots = append(s.slots, true)
	seq.slot = len(s.slots) - 1
}

// startSlotLocked gives a starting seq its slot, and marks it to be
// restored from the engine's saves before it is computed.
func (s *Scheduler) startSlotLocked(seq *sequence) {
	s.takeSlotLocked(seq)
	_, ok := s.engine.(Snapshotter)
	seq.restore = ok && seq.req.Priority != Canary
}

// releaseSlotLocked frees seq's slot, if it holds one.
func (s *Scheduler) releaseSlotLocked(seq *sequence) {
	if seq.slot < 0 {
		return
	}
	if sn, ok := s.engine.(Snapshotter); ok {
		sn.Drop(seq.slot)
	}
	s.slots[seq.slot], seq.slot = false, -1
}

// Snapshotter is an Engine that keeps K/V itself and can save a slot's
// into the node's shared store and restore it into another slot, maybe
// of another process (llama.cpp: a sequence's whole state at once). The
// scheduler saves a sequence each time its computed positions reach a
// new multiple of SnapshotEvery — at the end of its prefill, then every
// SnapshotEvery tokens — and restores a starting sequence from the
// longest saved prefix of its tokens instead of computing it.
type Snapshotter interface {
	// Save offers slot's K/V, which holds tokens (every one computed).
	// A failure only costs a later restore; it is the engine's to count.
	Save(slot int, tokens []int)
	// Restore fills slot with the K/V of the longest prefix of tokens
	// saved before, a multiple of SnapshotEvery, and returns its length
	// (0: none, the slot then holds nothing).
	Restore(slot int, tokens []int) int
	// Drop: slot's sequence ended; its saves need not be held any more
	// (they stay readable until the store needs their room).
	Drop(slot int)
}

// SnapshotEvery is the period, in positions, of a Snapshotter's saves.
const SnapshotEvery = 64

// restoreLocked restores the sequences that started since the last step
// from the engine's saves: under the lock (a restore is a few
// milliseconds of copying), and between steps (the engine's K/V is not
// being computed).
func (s *Scheduler) restoreLocked() {
	sn, ok := s.engine.(Snapshotter)
	if !ok {
		return
	}
	for _, seq := range s.running {
		if !seq.restore {
			continue
		}
		seq.restore = false
		if n := sn.Restore(seq.slot, seq.tokens[:len(seq.tokens)-1]); n > 0 {
			seq.computed, seq.saved = n, n/SnapshotEvery
			seq.reused += n
			s.reusedPositions += n
		}
	}
}

// save offers the step's sequences that reached a new multiple of
// SnapshotEvery to the engine's store; outside the lock, the sequences
// in flight.
func (s *Scheduler) save(seqs []*sequence) {
	sn, ok := s.engine.(Snapshotter)
	if !ok {
		return
	}
	for _, seq := range seqs {
		if seq.req.Priority == Canary || seq.computed/SnapshotEvery <= seq.saved {
			continue
		}
		seq.saved = seq.computed / SnapshotEvery
		sn.Save(seq.slot, seq.tokens[:seq.computed])
	}
}
