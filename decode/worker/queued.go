package worker

import (
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/wire"
)

// queueHeartbeat is how often a request waiting in the scheduler's queue
// is told so. The frontend's stall timeout (seconds) must stay well above
// it: a queued request that hears nothing is taken for a stalled worker.
const queueHeartbeat = time.Second

// queueProgress is the engine's progress a queued request's heartbeat
// depends on: a wedged engine sends none, so its requests stall out.
func (s *server) queueProgress() uint64 {
	st := s.engine.Stats()
	return st.Generated + st.Computed
}

// awaitStart waits for the first event of a sequence that may sit in the
// scheduler's queue: while it does, emit gets a queue_position frame at
// once and then one per queueHeartbeat in which the engine progressed.
// It returns the first event (ok false: the channel closed).
func (s *server) awaitStart(g *wire.Generate, events <-chan decode.Event, emit func(*wire.Frame) error) (decode.Event, bool) {
	id := sequenceID(g, s.opts.InstanceID)
	select {
	case ev, ok := <-events:
		return ev, ok
	default:
	}
	tick := time.NewTicker(queueHeartbeat)
	defer tick.Stop()
	last, sent := s.queueProgress(), false
	for {
		if pos := s.engine.QueuePosition(id); pos > 0 {
			if now := s.queueProgress(); !sent || now != last {
				last, sent = now, true
				emit(&wire.Frame{RequestId: g.RequestId, RequestEpoch: g.RequestEpoch, QueuePosition: uint32(pos)})
			}
		}
		select {
		case ev, ok := <-events:
			return ev, ok
		case <-tick.C:
		}
	}
}
