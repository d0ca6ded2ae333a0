package frontend

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/frontend/openai"
)

// A request of several choices has no record of its own: its id names
// its number of choices (groupID) and each choice has the record of a
// request of its own, at childID. A frontend without some of its choices
// reads their records in one range read and, for each one, replays a
// finished choice or takes a running one over (one transaction per
// choice, as for any request): no write beyond those of the choices.

// resumeChoices answers a resume of a request of several choices (false:
// id is not one). Its position holds one sequence number per choice.
func (s *Server) resumeChoices(w http.ResponseWriter, req *http.Request, id string) bool {
	k := groupCount(id)
	if k == 0 {
		return false
	}
	after := req.Header.Get("Last-Event-ID")
	if q := req.URL.Query().Get("starting_after"); q != "" {
		after = q
	}
	pos, perr := parsePositions(after, k)
	if perr != nil {
		writeParamError(w, perr)
		return true
	}
	g, ok := s.assemble(w, req, id, k)
	if !ok {
		return true
	}
	w.Header().Set("Lifeline-Request-Id", id)
	s.metrics.resumes.WithLabelValues("ok").Inc()
	s.followGroup(w, req, g, pos, false)
	return true
}

// cancelChoices answers a DELETE of a request of several choices (false:
// id is not one): every choice is cancelled, those driven elsewhere taken
// over first; one that ended on its own stays as it is.
func (s *Server) cancelChoices(w http.ResponseWriter, req *http.Request, id string) bool {
	k := groupCount(id)
	if k == 0 {
		return false
	}
	g, ok := s.assemble(w, req, id, k)
	if !ok {
		return true
	}
	rs, waits := g.states()
	finished := len(waits) == 0
	for _, r := range rs {
		if r != nil && r.Err != nil && r.Err.Type == openai.ErrCancelledType {
			finished = false
		}
	}
	if finished {
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "cancelled": false, "finished": true})
		return true
	}
	g.cancel(errClientCancelled)
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "cancelled": true})
	return true
}

// assemble is request id's k choices as this frontend can serve them: its
// own streams, and for the others their records (replayed when finished,
// taken over when running). It answers for the caller, and returns false,
// when a choice cannot be had: 404 (no record), 409 naming the frontend
// that took one over first, 503 (etcd).
func (s *Server) assemble(w http.ResponseWriter, req *http.Request, id string, k int) (*group, bool) {
	g := &group{id: id, children: make([]*stream, k)}
	missing := false
	for i := range k {
		g.children[i] = s.localStream(childID(id, i))
		missing = missing || g.children[i] == nil
	}
	if !missing {
		return g, true
	}
	if s.recs == nil {
		writeError(w, http.StatusNotFound, openai.ErrInvalidRequest, errNoStream)
		return nil, false
	}
	ctx, cancel := context.WithTimeout(req.Context(), takeoverTimeout)
	defer cancel()
	recs, err := s.choiceRecords(ctx, id)
	if err != nil {
		s.metrics.crossResumes.WithLabelValues("unavailable").Inc()
		writeError(w, http.StatusServiceUnavailable, openai.ErrTakeoverUnavailable, fmt.Sprintf("the request records cannot be read now: %v", err))
		return nil, false
	}
	took := false
	for i, st := range g.children {
		if st != nil {
			continue
		}
		v := recs[childID(id, i)]
		if g.children[i], err = s.choiceFromRecord(ctx, w, v); err != nil {
			return nil, false
		}
		took = took || (v.rec.ID != "" && !v.rec.Done)
	}
	if took {
		// Choices driven here now: one that fails for good cancels the
		// others whether or not anyone follows the stream, as at the
		// frontend that admitted them.
		s.goes.Go(func() { g.watchFailures(s.ctx) })
	}
	return g, true
}

// versioned is a record and its ModRevision.
type versioned struct {
	rec schema.RequestRecord
	rev int64
}

// choiceRecords reads the records of request id's choices, by child id.
func (s *Server) choiceRecords(ctx context.Context, id string) (map[string]versioned, error) {
	resp, err := s.etcd.Get(ctx, schema.RequestsPrefix+id+".", clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := map[string]versioned{}
	for _, kv := range resp.Kvs {
		rec, err := schema.DecodeRequestRecord(string(kv.Key), kv.Value)
		if err == nil {
			out[rec.ID] = versioned{rec, kv.ModRevision}
		}
	}
	return out, nil
}

// errAnswered: the choice could not be had, and the client was answered.
var errAnswered = errors.New("frontend: answered")

// choiceFromRecord is one choice from its record v (rec.ID "" if it has
// none): replayed if finished, else taken over and driven here.
func (s *Server) choiceFromRecord(ctx context.Context, w http.ResponseWriter, v versioned) (*stream, error) {
	rec := v.rec
	switch {
	case rec.ID == "":
		s.metrics.crossResumes.WithLabelValues("not_found").Inc()
		writeError(w, http.StatusNotFound, openai.ErrInvalidRequest, errNoStream)
		return nil, errAnswered
	case rec.Done:
		st, err := recordStream(rec)
		if err != nil {
			writeError(w, http.StatusInternalServerError, openai.ErrBadRequestRecord, err.Error())
			return nil, errAnswered
		}
		s.metrics.crossResumes.WithLabelValues("replayed").Inc()
		return st, nil
	}
	rs, won, err := s.recs.takeover(ctx, rec, v.rev)
	switch {
	case err != nil:
		s.metrics.takeovers.WithLabelValues("unavailable").Inc()
		writeError(w, http.StatusServiceUnavailable, openai.ErrTakeoverUnavailable, fmt.Sprintf("the request record cannot be taken over now: %v", err))
		return nil, errAnswered
	case !won:
		s.metrics.takeovers.WithLabelValues("lost").Inc()
		s.mu.Lock()
		st := s.streams[rec.ID]
		s.mu.Unlock()
		if st != nil { // the winner is this frontend (a concurrent resume)
			return st, nil
		}
		url := ""
		if now, _, err := s.recs.read(ctx, rec.ID); err == nil {
			url = now.OwnerURL
		}
		s.metrics.crossResumes.WithLabelValues("conflict").Inc()
		w.Header().Set("Lifeline-Owner-URL", url)
		writeError(w, http.StatusConflict, openai.ErrTakenOver, "another frontend took the request over: resume at "+url)
		return nil, errAnswered
	}
	s.metrics.takeovers.WithLabelValues("ok").Inc()
	s.metrics.crossResumes.WithLabelValues("taken_over").Inc()
	st, err := s.adopt(rs)
	if err != nil {
		writeError(w, http.StatusInternalServerError, openai.ErrBadRequestRecord, err.Error())
		return nil, errAnswered
	}
	return st, nil
}
