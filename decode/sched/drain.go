package sched

import "time"

// DrainDecision is what a draining worker does with a sequence in flight.
type DrainDecision int

const (
	// DrainFinishInPlace: the sequence's remaining tokens fit before the
	// drain's deadline at the current step time; it runs on here.
	DrainFinishInPlace DrainDecision = iota
	// DrainMoveNow: it cannot finish in time; it is ended now (retryable)
	// so that it continues elsewhere while this node can still serve its KV.
	DrainMoveNow
)

func (d DrainDecision) String() string {
	if d == DrainMoveNow {
		return "move_now"
	}
	return "finish_in_place"
}

// DrainMargin is the safety factor on a sequence's estimated time to
// finish: steps slow down as the batch changes, and a sequence that would
// end just past the deadline costs a later, rushed migration.
const DrainMargin = 1.5

// DecideDrain decides for one sequence with remaining tokens still to
// generate (at most: its max_tokens budget less those generated; a stop
// token may end it sooner) at stepTime per token. A sequence finishes in
// place when remaining × stepTime × DrainMargin ends before the deadline.
// Without a measured step time (no step ran yet) nothing can be estimated:
// the sequence stays, and the deadline ends it if it must.
func DecideDrain(remaining int, stepTime time.Duration, now, deadline time.Time) DrainDecision {
	if remaining <= 0 || stepTime <= 0 {
		return DrainFinishInPlace
	}
	// In floating point: the product may not fit a Duration.
	need := float64(stepTime) * float64(remaining) * DrainMargin
	if need > float64(deadline.Sub(now)) {
		return DrainMoveNow
	}
	return DrainFinishInPlace
}
