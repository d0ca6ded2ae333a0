package agent

import (
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// eventLog keeps the last events and fans new ones out to followers.
type eventLog struct {
	mu     sync.Mutex
	seq    uint64
	recent []controlapi.Event
	subs   map[chan controlapi.Event]struct{}
}

const eventLogSize = 1000

func newEventLog() *eventLog { return &eventLog{subs: map[chan controlapi.Event]struct{}{}} }

func (l *eventLog) add(e controlapi.Event) controlapi.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	e.Seq = l.seq
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	l.recent = append(l.recent, e)
	if len(l.recent) > eventLogSize {
		l.recent = l.recent[len(l.recent)-eventLogSize:]
	}
	for ch := range l.subs {
		select {
		case ch <- e:
		default: // a follower that does not read loses events, not the agent
		}
	}
	return e
}

func (l *eventLog) snapshot() []controlapi.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]controlapi.Event(nil), l.recent...)
}

func (l *eventLog) subscribe() (chan controlapi.Event, func()) {
	ch := make(chan controlapi.Event, 256)
	l.mu.Lock()
	l.subs[ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.subs, ch)
		l.mu.Unlock()
	}
}
