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

// releaseSlotLocked frees seq's slot, if it holds one.
func (s *Scheduler) releaseSlotLocked(seq *sequence) {
	if seq.slot >= 0 {
		s.slots[seq.slot], seq.slot = false, -1
	}
}
