package sched

import (
	"fmt"
	"slices"
)

// Cancel ends a queued or running sequence and frees its blocks before it
// returns.
func (s *Scheduler) Cancel(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq, ok := s.byID[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownSequence, id)
	}
	s.cancelLocked(seq)
	return nil
}

// cancelLocked ends seq; if a step is computing it, it waits for that step,
// which ends it, so that its blocks are free when this returns.
func (s *Scheduler) cancelLocked(seq *sequence) {
	if seq.inFlight {
		seq.cancelled = true
		for seq.inFlight {
			s.stepDone.Wait()
		}
	}
	if !seq.finished {
		s.finishLocked(seq, Finish{Reason: FinishCancelled, Err: ErrCancelled})
	}
}

func (s *Scheduler) finishLocked(seq *sequence, f Finish) {
	if seq.finished {
		return
	}
	seq.finished = true
	s.freeLocked(seq)
	s.releaseSlotLocked(seq)
	s.spec.dropLocked(seq)
	delete(s.byID, seq.req.ID)
	s.running = slices.DeleteFunc(s.running, func(x *sequence) bool { return x == seq })
	q := &s.queues[seq.req.Priority]
	*q = slices.DeleteFunc(*q, func(x *sequence) bool { return x == seq })
	f.Generated = seq.nOutput - len(seq.req.Prefix)
	f.ReusedPositions = seq.reused
	seq.req.OnFinish(f)
}
