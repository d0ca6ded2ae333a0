package sched

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
}

// Stats returns the current load.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Running: len(s.running), Queued: s.queuedLocked(), FreeBlocks: s.store.NumFree(), TotalBlocks: s.store.Capacity(), FreeErrors: s.freeErrors, ReusedPositions: s.reusedPositions, StepErrors: s.stepErrors, Recomputed: s.recomputed, Generated: s.generated}
}

func (s *Scheduler) queuedLocked() int {
	n := 0
	for _, q := range s.queues {
		n += len(q)
	}
	return n
}
