package route

import (
	"fmt"
	"sync"
	"time"
)

// The router's view of load under a burst: this frontend's own open
// streams per instance (a registration's count is only as fresh as its
// agent's last look) and the instances that just refused a request as
// overloaded.

// ErrInstancesFull is returned when every instance that could take a
// request refused one as overloaded within FullFor and has not ended a
// stream of this frontend since: the request is refused (429) without a
// worker attempt.
var ErrInstancesFull = fmt.Errorf("%w: every instance is at its limit", ErrNoInstance)

// FullFor is how long an instance that refused a request as overloaded is
// taken as full, unless one of this frontend's streams on it ends first.
const FullFor = time.Second

// Opened counts a decode stream this frontend opened to instance id; the
// returned func, called once when the stream ends, uncounts it.
func (rt *Router) Opened(id string) (closed func()) {
	rt.mu.Lock()
	rt.streams[id]++
	rt.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			rt.mu.Lock()
			defer rt.mu.Unlock()
			if rt.streams[id]--; rt.streams[id] <= 0 {
				delete(rt.streams, id)
			}
			// A slot or a queue place is free again.
			delete(rt.full, fullKey{id, PriorityInteractive})
			delete(rt.full, fullKey{id, PriorityBatch})
		})
	}
}

// Full records that instance id refused a request as overloaded: new
// requests skip it for FullFor, or until a stream of this frontend on it
// ends.
// It returns this frontend's open streams on id then (at least 1): the
// load at which it was full.
func (rt *Router) Full(id, priority string, now time.Time) int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.full[fullKey{id, PriorityOf(priority)}] = now.Add(FullFor)
	return max(1, rt.streams[id])
}

// fullKey is an instance full for requests of a priority.
type fullKey struct{ id, priority string }

// PriorityOf names a request's priority ("" is interactive).
func PriorityOf(p string) string {
	if p == PriorityBatch {
		return p
	}
	return PriorityInteractive
}

// fullLocked reports whether in is taken as full for priority: its own
// refusal, or for batch an interactive one too.
func (rt *Router) fullLocked(in Instance, priority string, now time.Time) bool {
	full := func(p string) bool {
		until, ok := rt.full[fullKey{in.ID, p}]
		return ok && now.Before(until)
	}
	if PriorityOf(priority) == PriorityBatch {
		return full(PriorityBatch) || full(PriorityInteractive)
	}
	return full(PriorityInteractive)
}

// atCapacityLocked reports whether this frontend's own open streams on in
// fill what its worker holds for priority (running and queued): one more
// would only be refused there.
func (rt *Router) atCapacityLocked(in Instance, priority string) bool {
	limit := in.Capacity
	if PriorityOf(priority) == PriorityBatch {
		limit = in.BatchCapacity
	}
	return limit > 0 && rt.streams[in.ID] >= limit
}

// loadLocked is an instance's outstanding sequences: its registration's
// count, or this frontend's open streams to it when that is more.
func (rt *Router) loadLocked(in Instance) int { return max(in.Outstanding, rt.streams[in.ID]) }
