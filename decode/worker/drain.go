package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/lifeline-llm/lifeline/decode/sched"
)

// A drain ends requests in flight with a retryable DRAINING error, after
// the tokens already sent; the frontend carries them on elsewhere, pulling
// their published KV from this node while it is still up.
var (
	// errDrainMove ends a request that cannot finish before the drain's
	// deadline at the worker's step time: it moves at once.
	errDrainMove = errors.New("the node is draining and this request cannot finish before the drain's deadline: continue elsewhere")
	// errDrainDeadline ends the requests still in flight at the deadline.
	errDrainDeadline = errors.New("the node is draining and its deadline passed: continue elsewhere")
)

// flight is one generation request being served.
type flight struct {
	id        string
	cancel    context.CancelCauseFunc
	maxTokens int
	// sent is the sequence number of the last output token (the prefix
	// included): maxTokens - sent bounds what is left to generate.
	sent atomic.Int64
	// completed is set by the serving goroutine when the request ended
	// without an error. kept (a drain let it finish here) and ended (a
	// drain ended it) are guarded by server.mu.
	completed   bool
	kept, ended bool
}

// track registers a request being served until untrack.
func (s *server) track(f *flight) {
	s.started.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight == nil {
		s.inFlight = map[*flight]struct{}{}
	}
	s.inFlight[f] = struct{}{}
}

// untrack forgets a request that ended; one a drain let finish here and
// that did is counted.
func (s *server) untrack(f *flight) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inFlight, f)
	if f.kept && !f.ended && f.completed {
		s.drainFinishedIn++
	}
}

// decideDrain decides for every request in flight, given the drain's
// deadline: those whose remaining tokens fit before it at the current
// step time finish here; the others end now (errDrainMove). A later
// decision (a tightened deadline) may move a request kept before.
//
// The step time is the mean of the last 64 steps, not the longest of the
// last 16: a request's time to finish is the sum of its steps, and one
// step stretched by a stall of the process (a core taken away for 100 ms
// on a shared host) would otherwise move every request in flight.
func (s *server) decideDrain(deadline time.Time) {
	step := s.engine.Stats().MeanStepTime
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for f := range s.inFlight {
		if f.ended {
			continue
		}
		remaining := f.maxTokens - int(f.sent.Load())
		decision := sched.DecideDrain(remaining, step, now, deadline)
		s.opts.Log.Info("drain", "request_id", f.id, "tokens_left", remaining, "step", step,
			"deadline_in", deadline.Sub(now).Round(time.Millisecond), "decision", decision)
		switch decision {
		case sched.DrainMoveNow:
			f.ended, f.kept = true, false
			s.drainMoved++
			f.cancel(errDrainMove)
		default:
			f.kept = true
		}
	}
}

// endInFlight ends every request still being served with
// errDrainDeadline: the drain's deadline passed.
func (s *server) endInFlight() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for f := range s.inFlight {
		f.ended = true
		f.cancel(errDrainDeadline)
	}
}
