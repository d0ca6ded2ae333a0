package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// A resume at a frontend that holds no log of the stream is answered
// from the request record: a finished request is replayed from its
// output; a running one is taken over (one transaction on the record's
// ModRevision: of racing frontends exactly one wins, the others answer
// 409 taken_over naming the winner) and driven here from the record.

// errNoStream answers a resume or cancel of a request no frontend holds.
const errNoStream = "no such stream (finished longer ago than the resume window?)"

// fromRecord reads request id's record and, if it is still running,
// takes it over (won: this frontend drives it now). It answers for the
// caller when the record cannot help (none, unreadable, etcd down) and
// returns false then; result labels the metrics of that answer.
func (s *Server) fromRecord(ctx context.Context, w http.ResponseWriter, id string, result func(string)) (rec schema.RequestRecord, rs *recordState, won, ok bool) {
	if s.recs == nil {
		writeError(w, http.StatusNotFound, openai.ErrInvalidRequest, errNoStream)
		return rec, nil, false, false
	}
	rec, rev, err := s.recs.read(ctx, id)
	if err == nil && !rec.Done {
		rs, won, err = s.recs.takeover(ctx, rec, rev)
	}
	switch {
	case errors.Is(err, errNoRecord):
		result("not_found")
		writeError(w, http.StatusNotFound, openai.ErrInvalidRequest, errNoStream)
	case errors.Is(err, schema.ErrBadRecord):
		result("bad_record")
		writeError(w, http.StatusInternalServerError, openai.ErrBadRequestRecord, err.Error())
	case err != nil:
		result("unavailable")
		writeError(w, http.StatusServiceUnavailable, openai.ErrTakeoverUnavailable, fmt.Sprintf("the request record cannot be read or taken over now: %v", err))
	default:
		return rec, rs, won, true
	}
	return rec, nil, false, false
}

// resumeFromRecord answers a resume of request id after sequence number
// from, whose token was checked, from its record.
func (s *Server) resumeFromRecord(w http.ResponseWriter, req *http.Request, id string, from int) {
	ctx, cancel := context.WithTimeout(req.Context(), takeoverTimeout)
	defer cancel()
	rec, rs, won, ok := s.fromRecord(ctx, w, id, func(result string) {
		if result != "bad_record" {
			s.metrics.takeovers.WithLabelValues(result).Inc()
		}
		s.metrics.crossResumes.WithLabelValues(result).Inc()
	})
	switch {
	case !ok:
	case rec.Done:
		s.replayRecord(w, req, rec, from)
	case won:
		s.metrics.takeovers.WithLabelValues("ok").Inc()
		s.metrics.crossResumes.WithLabelValues("taken_over").Inc()
		s.driveTakenOver(w, req, rs, from)
	default:
		s.lostTakeover(w, req, id, from)
	}
}

// lostTakeover answers a resume whose takeover another frontend won: a
// 409 naming the winner; or, if the winner is this frontend (a
// concurrent resume here), its stream; or, if the request ended
// meanwhile, its replay.
func (s *Server) lostTakeover(w http.ResponseWriter, req *http.Request, id string, from int) {
	s.metrics.takeovers.WithLabelValues("lost").Inc()
	s.mu.Lock()
	st := s.streams[id]
	s.mu.Unlock()
	if st != nil {
		s.follow(w, req, st, from, false)
		return
	}
	ctx, cancel := context.WithTimeout(req.Context(), takeoverTimeout)
	defer cancel()
	rec, _, err := s.recs.read(ctx, id)
	switch {
	case err != nil && !errors.Is(err, schema.ErrBadRecord) && !errors.Is(err, errNoRecord):
		writeError(w, http.StatusServiceUnavailable, openai.ErrTakeoverUnavailable, err.Error())
	case err == nil && rec.Done:
		s.replayRecord(w, req, rec, from)
	default:
		s.metrics.crossResumes.WithLabelValues("conflict").Inc()
		w.Header().Set("Lifeline-Owner-URL", rec.OwnerURL)
		writeError(w, http.StatusConflict, openai.ErrTakenOver, "another frontend took the request over: resume at "+rec.OwnerURL)
	}
}

// replayRecord streams a finished request's stored output after from,
// then its end, in the same shape as its owner did.
func (s *Server) replayRecord(w http.ResponseWriter, req *http.Request, rec schema.RequestRecord, from int) {
	st, err := recordStream(rec)
	if err != nil {
		writeError(w, http.StatusInternalServerError, openai.ErrBadRequestRecord, err.Error())
		return
	}
	s.metrics.takeovers.WithLabelValues("done_replay").Inc()
	s.metrics.crossResumes.WithLabelValues("replayed").Inc()
	w.Header().Set("Lifeline-Request-Id", rec.ID)
	s.follow(w, req, st, from, false)
}

// recordStream is the finished log of a finished request's record.
func recordStream(rec schema.RequestRecord) (*stream, error) {
	var body CompletionRequest
	if err := json.Unmarshal(rec.Body, &body); err != nil {
		return nil, fmt.Errorf("request %s: body: %v", rec.ID, err)
	}
	if rec.LogprobsOmitted {
		body.Logprobs, body.TopLogprobs = false, 0 // logprobs null: not kept
	}
	var end sse.Lifeline
	if rec.End != nil {
		json.Unmarshal(*rec.End, &end)
	}
	r := &reqfsm.Request{ID: rec.ID, State: reqfsm.Completed, FinishReason: rec.FinishReason}
	if rec.ErrorType != "" {
		r.State, r.Err = reqfsm.Failed, &reqfsm.RequestError{Type: openai.ErrorType(rec.ErrorType), Message: rec.ErrorMessage}
	}
	addRecordTokens(&r.Output, rec.Output)
	st := newStream(rec.ID, body, rec.Chat, true, func(error) {})
	st.setWorkerPromptLen(rec.PromptTokens)
	st.publish(r.Output.View())
	st.finish(r, end)
	return st, nil
}

// driveTakenOver runs a request this frontend just took over, from its
// record, and follows it for the client after from.
func (s *Server) driveTakenOver(w http.ResponseWriter, req *http.Request, rs *recordState, from int) {
	st, err := s.adopt(rs)
	if err != nil {
		writeError(w, http.StatusInternalServerError, openai.ErrBadRequestRecord, err.Error())
		return
	}
	w.Header().Set("Lifeline-Request-Id", st.id)
	s.follow(w, req, st, from, false)
}

// adopt runs a request this frontend just took over, from its record. A
// record that cannot be driven ends the request for good (so that no
// one tries again) with an error.
func (s *Server) adopt(rs *recordState) (*stream, error) {
	rec := rs.rec
	var body CompletionRequest
	err := json.Unmarshal(rec.Body, &body)
	if err == nil {
		err = body.validate()
	}
	if err != nil {
		r := &reqfsm.Request{ID: rec.ID, State: reqfsm.Failed, Err: &reqfsm.RequestError{Type: openai.ErrBadRequestRecord, Message: err.Error()}}
		st := newStream(rec.ID, body, rec.Chat, true, func(error) {})
		st.rec = rs
		s.goes.Go(func() { s.recs.complete(context.WithoutCancel(s.ctx), st, r, sse.Lifeline{RequestID: rec.ID}) })
		return nil, fmt.Errorf("request %s: %w", rec.ID, err)
	}
	now := time.Now()
	var deadline time.Time
	if rec.DeadlineUnixNano != 0 {
		deadline = time.Unix(0, rec.DeadlineUnixNano)
	}
	r := reqfsm.NewTakenOverRequest(reqfsm.NewRequest(rec.ID, make([]int, body.promptEstimate()), body.maxTokens(), deadline, s.opts.Policy, now), rec.Term)
	rctx, cancel := context.WithCancelCause(s.ctx)
	// Taken over by a resume: it lives through its client's disconnects
	// for the resume window, whatever it asked at admission.
	st := newStream(rec.ID, body, rec.Chat, true, cancel)
	st.rec = rs
	s.mu.Lock()
	s.streams[rec.ID] = st
	s.mu.Unlock()
	x := newRun(s, r, body, st)
	x.takeover, x.prefix = true, rec.Prefix
	s.goes.Go(func() { x.loop(rctx) })
	return st, nil
}

// cancelFromRecord answers a DELETE of request id, whose token was
// checked, at a frontend that holds no log of it: a running request is
// taken over and cancelled here (its worker's sequence with it); a
// finished one is reported finished, not cancelled.
func (s *Server) cancelFromRecord(w http.ResponseWriter, req *http.Request, id string) {
	st, done := s.takeOverFromRecord(w, req, id, func(string) {})
	switch {
	case st == nil:
	case done:
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "cancelled": false, "finished": true})
	default:
		st.cancel(errClientCancelled)
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "cancelled": true})
	}
}

// takeOverFromRecord is request id's log at a frontend that holds none:
// a finished request's replay (done), or a running one taken over from
// its record and run here — or, when a concurrent request here won the
// takeover, its log. nil when it answered for the caller: another
// frontend won (409 naming it), or the record cannot help; result labels
// the metrics of that answer.
func (s *Server) takeOverFromRecord(w http.ResponseWriter, req *http.Request, id string, result func(string)) (st *stream, done bool) {
	ctx, cancel := context.WithTimeout(req.Context(), takeoverTimeout)
	defer cancel()
	rec, rs, won, ok := s.fromRecord(ctx, w, id, result)
	switch {
	case !ok:
		return nil, false
	case rec.Done:
		st, err := recordStream(rec)
		if err != nil {
			writeError(w, http.StatusInternalServerError, openai.ErrBadRequestRecord, err.Error())
			return nil, false
		}
		return st, true
	case !won:
		s.metrics.takeovers.WithLabelValues("lost").Inc()
		s.mu.Lock()
		st := s.streams[id]
		s.mu.Unlock()
		if st != nil { // the winner is this frontend (a concurrent request)
			return st, false
		}
		url := ""
		if now, _, err := s.recs.read(ctx, id); err == nil {
			url = now.OwnerURL
		}
		w.Header().Set("Lifeline-Owner-URL", url)
		writeError(w, http.StatusConflict, openai.ErrTakenOver, "another frontend took the request over: ask it at "+url)
		return nil, false
	}
	s.metrics.takeovers.WithLabelValues("ok").Inc()
	st, err := s.adopt(rs)
	if err != nil {
		writeError(w, http.StatusInternalServerError, openai.ErrBadRequestRecord, err.Error())
		return nil, false
	}
	return st, false
}

// begin is the run's first step: a request admitted here starts with a
// route; one taken over starts as takeoverStart decides.
func (x *run) begin(ctx context.Context, now time.Time) []reqfsm.Action {
	if x.takeover {
		return x.takeoverStart(ctx, now)
	}
	return x.r.Start(now)
}
