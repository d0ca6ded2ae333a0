package frontend

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// A stream's follower holds no tokens of its own: it writes from the
// request's log by position, and a write to a client that does not read
// waits (TCP, HTTP/2 and HTTP/3 flow control), so a slow reader costs the
// log it reads and one blocked goroutine, never a growing buffer. What
// bounds the wait is the write timeout (Limits.WriteTimeout): a write
// (an event, or the few kilobytes of events buffered since the last)
// that the client's connection has not taken for that long is failed,
// the stream closed (HTTP/1.1: the connection; HTTP/2 and HTTP/3: the
// stream), and the follower ends, counted in
// lifeline_frontend_slow_clients_closed_total. A resumable request runs
// on: its client resumes by Last-Event-ID (or its resume token) within
// the resume window and gets the rest of the log, no gap, no duplicate.
// A plain request ends with its connection, as for any client that left.
//
// A stream that waits for tokens (a migration, a queue) is not writing
// and is never cut: the timeout runs only while a write is under way.
// One sweeper per frontend looks at the writes under way; a write costs
// two atomic stores.

// slowWatch is the frontend's writers under the write timeout.
type slowWatch struct {
	goes    *owned        // the server's
	timeout time.Duration // 0: none
	m       *metrics

	mu      sync.Mutex
	writers map[*deadlineWriter]struct{}
	running bool // the sweeper runs while there are writers
}

// deadlineWriter is a stream's response writer under the write timeout.
type deadlineWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// since is when the write under way began (unix ns; 0: none); cut is
	// set once the sweeper failed it.
	since atomic.Int64
	cut   atomic.Bool
}

// watch returns w under the write timeout (w itself with none), and its
// end, to be called before the handler returns: it reports whether the
// client was cut as too slow.
func (sw *slowWatch) watch(w http.ResponseWriter) (http.ResponseWriter, func() (cut bool)) {
	if sw == nil || sw.timeout <= 0 {
		return w, func() bool { return false }
	}
	d := &deadlineWriter{w: w, rc: http.NewResponseController(w)}
	sw.mu.Lock()
	if sw.writers == nil {
		sw.writers = map[*deadlineWriter]struct{}{}
	}
	sw.writers[d] = struct{}{}
	if !sw.running {
		sw.running = true
		sw.goes.Go(sw.sweep)
	}
	sw.mu.Unlock()
	return d, func() bool {
		sw.mu.Lock()
		delete(sw.writers, d)
		sw.mu.Unlock()
		return d.cut.Load()
	}
}

// sweep fails the writes under way for longer than the timeout, until no
// writer is left.
func (sw *slowWatch) sweep() {
	tick := time.NewTicker(min(max(sw.timeout/10, 10*time.Millisecond), time.Second))
	defer tick.Stop()
	for range tick.C {
		now := time.Now()
		sw.mu.Lock()
		if len(sw.writers) == 0 {
			sw.running = false
			sw.mu.Unlock()
			return
		}
		for d := range sw.writers {
			if at := d.since.Load(); at != 0 && now.Sub(time.Unix(0, at)) >= sw.timeout && !d.cut.Load() {
				// Under mu: the handler has not returned (it leaves the
				// map first), so the controller may still be used.
				d.cut.Store(true)
				d.rc.SetWriteDeadline(now)
				if sw.m != nil {
					sw.m.slowClients.Inc()
				}
			}
		}
		sw.mu.Unlock()
	}
}

func (d *deadlineWriter) Header() http.Header         { return d.w.Header() }
func (d *deadlineWriter) WriteHeader(status int)      { d.w.WriteHeader(status) }
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.w }

// Write writes p, under way for the sweeper meanwhile.
func (d *deadlineWriter) Write(p []byte) (int, error) {
	d.since.Store(time.Now().UnixNano())
	n, err := d.w.Write(p)
	d.since.Store(0)
	return n, err
}

// Flush writes what is buffered to the client, under way meanwhile.
func (d *deadlineWriter) Flush() {
	d.since.Store(time.Now().UnixNano())
	d.rc.Flush()
	d.since.Store(0)
}
