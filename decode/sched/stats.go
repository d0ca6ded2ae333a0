package sched

import "time"

// Stats is a snapshot of the scheduler's load.
type Stats struct {
	Running, Queued, FreeBlocks, TotalBlocks int
	FreeErrors                               int
	// ReusedPositions counts positions whose K/V came from a shared store
	// instead of being computed.
	ReusedPositions int
	// StepErrors counts forward passes that failed (their batch ended).
	StepErrors int
	// Recomputed counts sequences recomputed after their KV blocks were
	// taken back.
	Recomputed int
	// Generated counts every token sampled since the scheduler started.
	Generated uint64
	// Computed counts every position whose K/V a step computed (prefill
	// chunks and decode steps alike): progress of a sequence that samples
	// nothing yet.
	Computed uint64
	// StepTime is the longest of the last steps (forward pass and
	// sampling): what a request arriving now may wait behind, and what
	// each of its own steps may take while that load lasts.
	StepTime time.Duration
	// MeanStepTime is the mean of the last steps, over a longer window
	// (64): what the next many steps will take together, each. A stall of
	// the process (a preempted core, a pause) lands in one step and moves
	// it a sixty-fourth of its length, where it would set StepTime: a
	// sequence's time to finish is a sum of steps, so a drain's decision
	// uses this one.
	MeanStepTime time.Duration
	// DraftProposed counts draft tokens proposed by speculative decoding;
	// DraftAccepted those committed because the target chose them too.
	DraftProposed, DraftAccepted uint64
}

// Stats returns the current load.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Running: len(s.running), Queued: s.queuedLocked(), FreeBlocks: s.store.NumFree(), TotalBlocks: s.store.Capacity(), FreeErrors: s.freeErrors, ReusedPositions: s.reusedPositions, StepErrors: s.stepErrors, Recomputed: s.recomputed, Generated: s.generated,
		Computed: s.computed}
	st.StepTime, st.MeanStepTime = stepTimes(s.stepTimes[:], s.stepCount)
	if s.spec != nil {
		st.DraftProposed, st.DraftAccepted = s.spec.proposed, s.spec.accepted
	}
	return st
}

// stepTimes is the longest of the last recentSteps steps and the mean of
// the last len(ring) (fewer when fewer ran), given the ring of step
// durations written at count%len(ring) and the count of steps so far.
func stepTimes(ring []time.Duration, count int) (longest, mean time.Duration) {
	n := min(count, len(ring))
	if n == 0 {
		return 0, 0
	}
	var sum time.Duration
	for i := 1; i <= n; i++ {
		d := ring[(count-i)%len(ring)]
		if i <= recentSteps {
			longest = max(longest, d)
		}
		sum += d
	}
	return longest, sum / time.Duration(n)
}

func (s *Scheduler) queuedLocked() int {
	n := 0
	for _, q := range s.queues {
		n += len(q)
	}
	return n
}
