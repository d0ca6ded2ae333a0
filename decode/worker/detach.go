package worker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/frame"
)

// A detachable request (Generate.detach_grace_ms > 0) outlives its stream:
// the engine appends its frames to a bounded log, and a sender per
// attached stream writes them from there, so that generation never waits
// for a slow or vanished peer. Its stream ending without an explicit
// cancel detaches it; an Attach (another frontend, at a higher request
// epoch) takes it over, replaying the log, then following it live.
var (
	errClientCancel = errors.New("the client cancelled the request")
	errGraceExpired = errors.New("detached and nobody attached within its grace")
	errSuperseded   = errors.New("a newer Generate of the same request replaced it")
	errStopping     = errors.New("detached while the worker stops: nobody can attach any more")
)

// takeOverWrite bounds how long a stream taken over may keep the sender
// blocked in a write (a peer that stopped reading) before its TAKEN_OVER
// frame is given up.
const takeOverWrite = 2 * time.Second

// session is a detachable request: its frame log and who it is served to.
type session struct {
	id     string
	grace  time.Duration
	cancel context.CancelCauseFunc
	// firstSeq is the first sequence number this worker generates: a
	// migration's continuation starts after the prefix it was given.
	firstSeq int32

	mu sync.Mutex
	// epoch is the request epoch it is served under: its Generate's, then
	// each accepted Attach's.
	epoch uint64
	log   frameLog
	att   *attachment // nil while detached
	// done: the finish frame is in the log. gone: removed from the
	// server's table (cancelled, superseded or forgotten).
	done, gone bool
	// detached: counted in server.detachedNow (running, no stream).
	detached bool
	timer    *time.Timer
	timerSeq uint64
	// changed is closed (and replaced) whenever the log grows.
	changed chan struct{}
}

// attachment is one stream a session is served to.
type attachment struct {
	st    *quic.Stream
	epoch uint64
	from  int32
	// stop is closed when a newer Attach took the request over; takenBy
	// is that Attach's epoch (set first, under the session's lock).
	stop    chan struct{}
	takenBy uint64
}

func newAttachment(st *quic.Stream, epoch uint64, from int32) *attachment {
	return &attachment{st: st, epoch: epoch, from: max(from, 1), stop: make(chan struct{})}
}

// setDetached keeps server.detachedNow in step; ss.mu is held.
func (ss *session) setDetached(s *server, d bool) {
	if ss.detached == d {
		return
	}
	ss.detached = d
	if d {
		s.detachedNow.Add(1)
	} else {
		s.detachedNow.Add(-1)
	}
}

// arm (re)starts the session's grace timer; ss.mu is held.
func (ss *session) arm(s *server) {
	ss.disarm()
	seq := ss.timerSeq
	ss.timer = time.AfterFunc(ss.grace, func() { s.graceOver(ss, seq) })
}

// disarm stops the grace timer; one that already fired finds its
// sequence number stale. ss.mu is held.
func (ss *session) disarm() {
	ss.timerSeq++
	if ss.timer != nil {
		ss.timer.Stop()
		ss.timer = nil
	}
}

// graceOver ends a session detached for its whole grace (cancelled), or
// forgets one finished for that long.
func (s *server) graceOver(ss *session, seq uint64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.timerSeq != seq || (!ss.done && ss.att != nil) {
		return
	}
	s.endLocked(ss, errGraceExpired)
}

// endLocked removes ss from the table and, if it still runs, cancels it
// with cause. ss.mu is held.
func (s *server) endLocked(ss *session, cause error) {
	if ss.gone {
		return
	}
	ss.gone = true
	ss.disarm()
	ss.setDetached(s, false)
	s.smu.Lock()
	if s.sessions[ss.id] == ss {
		delete(s.sessions, ss.id)
	}
	s.smu.Unlock()
	if !ss.done {
		ss.cancel(cause)
	}
}

// register enters a new session in the table. A session of the same
// request served under a lower epoch (a frontend that migrated the
// request onto this worker again) is replaced: its stream is taken over
// and its sequence cancelled. One under an epoch at least as high wins.
func (s *server) register(ss *session) error {
	for {
		s.smu.Lock()
		if s.sessions == nil {
			s.sessions = map[string]*session{}
		}
		old := s.sessions[ss.id]
		if old == nil {
			s.sessions[ss.id] = ss
			s.smu.Unlock()
			return nil
		}
		s.smu.Unlock()
		old.mu.Lock()
		if !old.gone && old.epoch >= ss.epoch {
			old.mu.Unlock()
			return fmt.Errorf("request %s is held here under epoch %d, not below %d", ss.id, old.epoch, ss.epoch)
		}
		if old.att != nil {
			takeOver(old.att, ss.epoch)
			old.att = nil
		}
		s.endLocked(old, errSuperseded)
		old.mu.Unlock()
	}
}

// takeOver tells a's sender that the Attach at epoch took its request
// over, and unblocks a write it may be stuck in. The session's lock is
// held.
func takeOver(a *attachment, epoch uint64) {
	a.takenBy = epoch
	close(a.stop)
	a.st.SetWriteDeadline(time.Now().Add(takeOverWrite))
}

// record appends the engine's next frame; last marks the finish frame.
func (s *server) record(ss *session, f *wire.Frame, last bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.log.append(f) {
		s.framesDropped.Add(1)
	}
	if ss.att == nil && !ss.gone {
		s.framesBuffered.Add(1)
	}
	if last {
		ss.done = true
		ss.setDetached(s, false)
		if !ss.gone {
			ss.arm(s) // the frames are kept for the grace after the end
		}
	}
	close(ss.changed)
	ss.changed = make(chan struct{})
}

// lost handles the end of a's stream (cause: its context's, or the write
// error): an explicit cancel (STOP_SENDING with workerclient.CodeCancel)
// cancels the request; anything else detaches it for its grace.
func (s *server) lost(ss *session, a *attachment, cause error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.att != a || ss.gone {
		return // taken over meanwhile, or ended
	}
	ss.att = nil
	var se *quic.StreamError
	switch {
	case errors.As(cause, &se) && se.Remote && se.ErrorCode == workerclient.CodeCancel:
		s.endLocked(ss, errClientCancel)
	case ss.done:
		// Finished: its frames stay for the grace already running.
	case s.stopping.Load():
		s.endLocked(ss, errStopping)
	default:
		ss.setDetached(s, true)
		ss.arm(s)
	}
}

// stopDetached ends, as the worker stops, what nobody can attach to any
// more (no stream is accepted once it stops): detached requests are
// cancelled, finished ones forgotten. Attached ones finish as any
// request in flight does.
func (s *server) stopDetached() {
	s.stopping.Store(true)
	s.smu.Lock()
	all := slices.Collect(maps.Values(s.sessions))
	s.smu.Unlock()
	for _, ss := range all {
		ss.mu.Lock()
		if ss.done || ss.att == nil {
			s.endLocked(ss, errStopping)
		}
		ss.mu.Unlock()
	}
}

// errorFrame is a request's one error frame.
func errorFrame(id string, epoch uint64, code wire.Code, format string, args ...any) *wire.Frame {
	return &wire.Frame{RequestId: id, RequestEpoch: epoch, FinishReason: "error",
		Error: &wire.Error{Code: code, Message: fmt.Sprintf(format, args...)}}
}

// attach serves an Attach: on acceptance the stream gets the request's
// frames from the asked sequence number on, and the stream attached
// before (if any) is taken over.
func (s *server) attach(st *quic.Stream, at *wire.Attach, send func(*wire.Frame) error) {
	fail := func(code wire.Code, format string, args ...any) {
		send(errorFrame(at.RequestId, at.RequestEpoch, code, format, args...))
	}
	if at.RequestId == "" || at.FromSequenceNo < 0 {
		fail(wire.Code_INVALID_REQUEST, "attach: request_id %q, from_sequence_no %d: want a request id and a sequence number >= 0",
			at.RequestId, at.FromSequenceNo)
		return
	}
	s.smu.Lock()
	ss := s.sessions[at.RequestId]
	s.smu.Unlock()
	if ss == nil {
		fail(wire.Code_NOT_FOUND, "attach: no request %s here (never started, cancelled, or forgotten after its grace)", at.RequestId)
		return
	}
	a := newAttachment(st, at.RequestEpoch, at.FromSequenceNo)
	ss.mu.Lock()
	switch {
	case ss.gone:
		ss.mu.Unlock()
		fail(wire.Code_NOT_FOUND, "attach: request %s ended (cancelled, or forgotten after its grace)", at.RequestId)
		return
	case at.RequestEpoch <= ss.epoch:
		epoch := ss.epoch
		ss.mu.Unlock()
		fail(wire.Code_STALE_EPOCH, "attach: request %s at epoch %d: it is served under epoch %d", at.RequestId, at.RequestEpoch, epoch)
		return
	case a.from < ss.firstSeq:
		first := ss.firstSeq
		ss.mu.Unlock()
		fail(wire.Code_NOT_FOUND, "attach: request %s from sequence %d: this worker continues it from sequence %d (a migration's continuation)",
			at.RequestId, a.from, first)
		return
	case a.from <= ss.log.droppedThrough:
		through := ss.log.droppedThrough
		ss.mu.Unlock()
		fail(wire.Code_NOT_FOUND, "attach: request %s from sequence %d: frames dropped through sequence %d (the log keeps %d)",
			at.RequestId, a.from, through, ss.log.limit)
		return
	}
	if ss.att != nil {
		takeOver(ss.att, at.RequestEpoch)
	}
	ss.att, ss.epoch = a, at.RequestEpoch
	ss.setDetached(s, false)
	if !ss.done {
		ss.disarm()
	}
	start := ss.log.first()
	ss.mu.Unlock()
	s.attaches.Add(1)
	// Accepted: say so at once (sequence 0, no token), so that the new
	// owner does not mistake a holder that is still prefilling, or queued,
	// for one that does not answer.
	send(&wire.Frame{RequestId: at.RequestId, RequestEpoch: at.RequestEpoch})
	s.serveAttached(ss, a, start)
}

// serveAttached writes ss's frames from log index next on to a's stream,
// stamped with a's epoch, until the finish frame, a takeover or the
// stream's end (which detaches or cancels the request, see lost).
func (s *server) serveAttached(ss *session, a *attachment, next int) {
	w := bufio.NewWriter(a.st)
	write := func(f *wire.Frame) error {
		c := proto.Clone(f).(*wire.Frame)
		c.RequestEpoch = a.epoch
		return frame.Write(w, s.stamp(c))
	}
	failed := func(err error) {
		select {
		case <-a.stop:
			s.endTaken(ss, a, write, w)
		default:
			s.lost(ss, a, err)
		}
	}
	for {
		ss.mu.Lock()
		if next < ss.log.first() {
			ss.mu.Unlock()
			// This stream fell a whole log behind: end it as an Attach
			// that came too late would be, and detach the request.
			if write(errorFrame(ss.id, a.epoch, wire.Code_NOT_FOUND, "frames dropped: the stream fell %d frames behind", ss.log.limit)) == nil {
				w.Flush()
			}
			s.lost(ss, a, errors.New("stream fell behind its log"))
			return
		}
		batch, done, changed := ss.log.since(next), ss.done, ss.changed
		next += len(batch)
		ss.mu.Unlock()
		for _, f := range batch {
			select {
			case <-a.stop:
				s.endTaken(ss, a, write, w)
				return
			default:
			}
			if f.SequenceNo > 0 && f.SequenceNo < a.from {
				continue
			}
			if err := write(f); err != nil {
				failed(err)
				return
			}
		}
		if err := w.Flush(); err != nil {
			failed(err)
			return
		}
		if done {
			return // the finish frame was written
		}
		select {
		case <-changed:
		case <-a.stop:
			s.endTaken(ss, a, write, w)
			return
		case <-a.st.Context().Done():
			s.lost(ss, a, context.Cause(a.st.Context()))
			return
		}
	}
}

// endTaken ends a stream whose request an Attach took over with one
// TAKEN_OVER frame, written within the deadline takeOver set.
func (s *server) endTaken(ss *session, a *attachment, write func(*wire.Frame) error, w *bufio.Writer) {
	ss.mu.Lock()
	by := a.takenBy
	ss.mu.Unlock()
	f := errorFrame(ss.id, a.epoch, wire.Code_TAKEN_OVER, "request %s was taken over at epoch %d", ss.id, by)
	if write(f) != nil || w.Flush() != nil {
		a.st.CancelWrite(0)
	}
}
