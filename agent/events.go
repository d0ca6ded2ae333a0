package agent

import (
	"sync"
	"time"
)

// Failure classes, as events and metrics name them.
const (
	ReasonExitCode      = "exit_code"
	ReasonSignal        = "signal"
	ReasonOOM           = "oom_kill"
	ReasonCanaryTimeout = "canary_timeout"
	ReasonCanaryError   = "canary_error"
	ReasonGPUXid        = "gpu_xid"
)

// Event kinds.
const (
	EventStarted      = "started"
	EventReady        = "ready"
	EventNotReady     = "not_ready"
	EventExit         = "exit"
	EventCrashLoop    = "crash_loop"
	EventLeaseLost    = "lease_lost"
	EventReregistered = "reregistered"
	EventAdopted      = "adopted"
)

// Event is one thing that happened to an instance or the agent.
type Event struct {
	Seq        uint64    `json:"seq"`
	Time       time.Time `json:"time"`
	Node       string    `json:"node"`
	Kind       string    `json:"kind"`
	InstanceID string    `json:"instance_id,omitempty"`
	Generation uint64    `json:"generation,omitempty"`
	PID        int       `json:"pid,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	ExitCode   int       `json:"exit_code,omitempty"`
	Signal     int       `json:"signal,omitempty"`
	Detector   string    `json:"detector,omitempty"`
	// DetectedAt is when the detector saw a death (kernel time for eBPF).
	DetectedAt time.Time `json:"detected_at,omitzero"`
	Detail     string    `json:"detail,omitempty"`
}

// eventLog keeps the last events and fans new ones out to followers.
type eventLog struct {
	mu     sync.Mutex
	seq    uint64
	recent []Event
	subs   map[chan Event]struct{}
}

const eventLogSize = 1000

func newEventLog() *eventLog { return &eventLog{subs: map[chan Event]struct{}{}} }

func (l *eventLog) add(e Event) Event {
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

func (l *eventLog) snapshot() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.recent...)
}

func (l *eventLog) subscribe() (chan Event, func()) {
	ch := make(chan Event, 256)
	l.mu.Lock()
	l.subs[ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.subs, ch)
		l.mu.Unlock()
	}
}
