package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// The Responses API: every response is a Lifeline request (a chat
// request under the response's id, with a record when stored), so it
// migrates across worker failures and, stored, is retrieved, resumed
// (starting_after a sequence number) and cancelled at any frontend: one
// that holds no log of it takes it over from its record, as a resume of
// a chat stream does.

// responseRefusal is a refusal of a response's id: not found (also for a
// wrong credential: nobody learns that another's response exists),
// or etcd unavailable.
type responseRefusal struct {
	status int
	typ    openai.ErrorType
	code   string
	msg    string
}

func (e *responseRefusal) Error() string { return e.msg }

func (e *responseRefusal) write(w http.ResponseWriter) {
	writeErrorBody(w, e.status, e.typ, e.code, "", e.msg)
}

func notFound(id string) *responseRefusal {
	return &responseRefusal{status: http.StatusNotFound, typ: openai.ErrInvalidRequest, code: CodeResponseNotFound,
		msg: fmt.Sprintf("no response %q here: a response is kept for the resume window, and only for the credential that created it", id)}
}

// lookupTimeout bounds the etcd reads of a response's lookup.
const lookupTimeout = 2 * time.Second

// handleResponseCreate answers POST /v1/responses.
func (s *Server) handleResponseCreate(w http.ResponseWriter, req *http.Request) {
	data, err := s.readBody(w, req)
	if err != nil {
		s.refuse(w, req, err)
		return
	}
	id := newResponseID()
	ctx, cancel := context.WithTimeout(req.Context(), lookupTimeout)
	body, err := s.decodeResponse(ctx, data, req, id)
	cancel()
	if err == nil {
		err = responsesParam(s.checkPromptSize(&body, true))
	}
	var rf *responseRefusal
	switch {
	case errors.As(err, &rf):
		rf.write(w)
		return
	case err != nil:
		s.refuse(w, req, err)
		return
	case !s.mayServe(body.Model):
		writeModelNotFound(w, body.Model)
		return
	}
	if !body.SeedSet {
		body.Seed, body.SeedSet, body.SeedDrawn = randomSeed(), true, true
	}
	meta := body.Response
	meta.CreatedAt = time.Now().Unix()
	if e := s.reserveRecord(&body, 1); e != nil {
		if pe, ok := responsesParam(&ParamError{Param: e.param}).(*ParamError); ok {
			e.param = pe.Param // the conversation: input (with previous_response_id's)
		}
		e.write(w)
		return
	}
	st := s.startAs(id, body, true, meta.Background)
	w.Header().Set("Lifeline-Request-Id", id)
	w.Header().Set("Lifeline-Seed", strconv.FormatUint(body.Seed, 10))
	switch {
	case body.Stream:
		if streamable(w, req, st) {
			s.follow(w, req, st, -1, true) // its events from the first
		}
	case meta.Background:
		// Answered once its record is stored: then any frontend finds it.
		if st.rec != nil {
			select {
			case <-st.rec.stored:
			case <-req.Context().Done():
				return
			}
		}
		obj := st.responseObject()
		if obj.Status == openai.StatusInProgress && len(obj.Output) == 0 {
			obj.Status = openai.StatusQueued
		}
		writeJSON(w, http.StatusOK, obj)
	default:
		s.writeWholeResponse(w, req, st)
	}
}

// completionWait bounds how long a response's end waits for its record.
const completionWait = 2 * time.Second

// awaitRecorded waits (at most completionWait) until the end of the
// response this frontend drives is in its record.
func awaitRecorded(ctx context.Context, st *stream) {
	if st.rec == nil {
		return
	}
	t := time.NewTimer(completionWait)
	defer t.Stop()
	select {
	case <-st.rec.completion():
	case <-t.C:
	case <-ctx.Done():
	}
}

// writeWholeResponse answers a response that is neither streamed nor in
// the background once it has ended.
func (s *Server) writeWholeResponse(w http.ResponseWriter, req *http.Request, st *stream) {
	st.useRouter(s.router)
	defer st.watch()()
	for {
		done, r, changed := st.state()
		if done {
			if r.Err != nil && r.Output.Len() == 0 && r.Err.Type != openai.ErrCancelledType {
				writeRequestErrorFor(w, r.Err, &st.body)
				return
			}
			awaitRecorded(req.Context(), st)
			writeJSON(w, http.StatusOK, st.responseObject())
			return
		}
		select {
		case <-changed:
		case <-req.Context().Done():
			st.clientGone()
			return
		}
	}
}

// writeResponseFrom writes the response's events after sequence number
// after as its log grows, then its end; false when the client went away
// first.
func (st *stream) writeResponseFrom(ctx context.Context, sw *sse.Writer, flusher http.Flusher, after int, p *pulse) bool {
	rr := newResponseRender(st, func(ev openai.Event) bool {
		if ev.SequenceNumber <= after {
			return true
		}
		p.sent()
		return sw.WriteEvent(ev.Type, strconv.Itoa(ev.SequenceNumber), ev) == nil
	})
	flush := func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
	rr.start()
	fed := 0
	for {
		toks, done, r, changed := st.snapshot()
		for t := range toks.From(fed) {
			rr.feed(t)
			fed = t.SequenceNo
		}
		if !rr.ok {
			return false
		}
		flush()
		if done {
			awaitRecorded(ctx, st)
			if !rr.finish(r) {
				// Not the end: it goes on at the new owner, where the
				// client resumes after the last sequence number it saw.
				ev := openai.ErrorEvent{Type: openai.EventError, Code: string(r.Err.Type), Message: r.Err.Message}
				if st.rec != nil {
					st.rec.mu.Lock()
					ev.OwnerURL = st.rec.movedTo
					st.rec.mu.Unlock()
				}
				sw.WriteEvent(openai.EventError, "", ev)
			}
			flush()
			return rr.ok
		}
		if !p.await(ctx, changed) {
			return false
		}
	}
}

// findResponse is response id for req: this frontend's log of it, or its
// record (rec set, st nil) when another frontend holds it or none does.
func (s *Server) findResponse(ctx context.Context, id string, req *http.Request) (*stream, *schema.RequestRecord, error) {
	if !strings.HasPrefix(id, "resp_") {
		return nil, nil, notFound(id)
	}
	if st := s.localStream(id); st != nil {
		if m := st.body.Response; m == nil || !m.Store || !sameCredential(m.Credential, req) || s.deleted(ctx, st) {
			return nil, nil, notFound(id)
		}
		return st, nil, nil
	}
	if s.recs == nil {
		return nil, nil, notFound(id)
	}
	rec, _, err := s.recs.read(ctx, id)
	switch {
	case errors.Is(err, errNoRecord):
		return nil, nil, notFound(id)
	case errors.Is(err, schema.ErrBadRecord):
		// Answered as an unknown id: whether the credential may read it
		// cannot be told.
		s.log.Warn("frontend: a response's record is malformed", "request_id", id, "err", err)
		return nil, nil, notFound(id)
	case err != nil:
		return nil, nil, &responseRefusal{status: http.StatusServiceUnavailable, typ: openai.ErrTakeoverUnavailable, code: string(openai.ErrTakeoverUnavailable),
			msg: fmt.Sprintf("the response's record cannot be read now: %v", err)}
	}
	var body struct {
		Response *responseMeta `json:"response"`
	}
	if json.Unmarshal(rec.Body, &body) != nil || body.Response == nil || !sameCredential(body.Response.Credential, req) {
		return nil, nil, notFound(id)
	}
	return nil, &rec, nil
}

// deleted: st is a finished response whose record was deleted (at any
// frontend); this frontend then forgets it. An unreadable record is not
// deleted.
func (s *Server) deleted(ctx context.Context, st *stream) bool {
	if done, _, _ := st.state(); !done || st.rec == nil || s.recs == nil {
		return false
	}
	st.rec.mu.Lock()
	written := st.rec.rev != 0
	st.rec.mu.Unlock()
	if !written { // never stored (etcd was slow): nothing to delete
		return false
	}
	resp, err := s.etcd.Get(ctx, schema.RequestsPrefix+st.id, clientv3.WithCountOnly())
	if err != nil || resp.Count > 0 {
		return false
	}
	s.mu.Lock()
	if s.streams[st.id] == st {
		delete(s.streams, st.id)
	}
	s.mu.Unlock()
	return true
}

// storedResponse is response id as a finished or running log: this
// frontend's, a finished record's replay, or (running elsewhere) its
// record as admitted, with nothing delivered yet.
func (s *Server) storedResponse(ctx context.Context, id string, req *http.Request) (*stream, error) {
	st, rec, err := s.findResponse(ctx, id, req)
	if err != nil || st != nil {
		return st, err
	}
	if !rec.Done {
		return runningStream(*rec)
	}
	st, err = recordStream(*rec)
	if err != nil {
		return nil, &responseRefusal{status: http.StatusInternalServerError, typ: openai.ErrBadRequestRecord, code: string(openai.ErrBadRequestRecord), msg: err.Error()}
	}
	return st, nil
}

// runningStream is a running request's record as a log that has not
// started: what a frontend that does not drive it can say of it.
func runningStream(rec schema.RequestRecord) (*stream, error) {
	var body CompletionRequest
	if err := json.Unmarshal(rec.Body, &body); err != nil {
		return nil, err
	}
	st := newStream(rec.ID, body, rec.Chat, true, func(error) {})
	return st, nil
}

// handleResponseGet answers GET /v1/responses/{id}: the response object,
// or with stream=true (the query, or a JSON body as the Go SDK sends it)
// its events after starting_after.
func (s *Server) handleResponseGet(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	q := req.URL.Query()
	stream := q.Get("stream") == "true" || s.streamInBody(w, req)
	after := -1
	v := q.Get("starting_after")
	if v == "" {
		v = req.Header.Get("Last-Event-ID") // an EventSource's reconnection
	}
	if v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeParamError(w, invalid("starting_after", "%q: want the sequence number (≥ 0) of the last event seen", v))
			return
		}
		after = n
	}
	ctx, cancel := context.WithTimeout(req.Context(), lookupTimeout)
	st, rec, err := s.findResponse(ctx, id, req)
	cancel()
	var rf *responseRefusal
	if errors.As(err, &rf) {
		rf.write(w)
		return
	}
	if !stream {
		s.writeResponseObject(w, req, st, rec)
		return
	}
	if st == nil && rec.Done {
		if st, err = recordStream(*rec); err != nil {
			writeError(w, http.StatusInternalServerError, openai.ErrBadRequestRecord, err.Error())
			return
		}
	}
	if st != nil {
		if done, _, _ := st.state(); done && after >= 0 {
			if n := newResponseRender(st, nil).count(); after >= n {
				writeParamError(w, &ParamError{Param: "starting_after", Code: CodeStartingAfterRange,
					Message: fmt.Sprintf("%d: the response has %d events (sequence numbers 0 to %d)", after, n, n-1)})
				return
			}
		}
		w.Header().Set("Lifeline-Request-Id", id)
		s.follow(w, req, st, after, false)
		return
	}
	// Running at another frontend, or at none: taken over from its record.
	s.resumeFromRecord(w, req, id, after)
}

// streamInBody reads the JSON body a GET of the Go SDK's GetStreaming
// carries ({"stream": true}): a small one only, under the body timeout.
func (s *Server) streamInBody(w http.ResponseWriter, req *http.Request) bool {
	if req.ContentLength <= 0 || req.ContentLength > 1<<10 {
		return false
	}
	rc := http.NewResponseController(w)
	if !s.limits.Off && rc.SetReadDeadline(time.Now().Add(s.limits.BodyTimeout)) == nil {
		defer rc.SetReadDeadline(time.Time{})
	}
	var b struct {
		Stream bool `json:"stream"`
	}
	data, err := io.ReadAll(io.LimitReader(req.Body, req.ContentLength))
	return err == nil && json.Unmarshal(data, &b) == nil && b.Stream
}

// count is the number of events of a finished log.
func (rr *responseRender) count() int {
	toks, _, r, _ := rr.st.snapshot()
	rr.start()
	for t := range toks.From(0) {
		rr.feed(t)
	}
	rr.finish(r)
	return rr.seq
}
