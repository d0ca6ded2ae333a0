package frontend

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/frontend/openai"
)

// This file holds what a client does to a response after creating it:
// read it whole, cancel it, delete it, list its input items.

// cancelWait bounds how long a cancel waits for the response's run to
// end, so that it answers with the cancelled response.
const cancelWait = 5 * time.Second

// writeResponseObject answers a GET of the response object: from this
// frontend's log, a finished record, or a running one's record (taken
// over first when its owner is gone, so that a background response
// whose frontend died goes on while its client polls).
func (s *Server) writeResponseObject(w http.ResponseWriter, req *http.Request, st *stream, rec *schema.RequestRecord) {
	var err error
	switch {
	case st != nil:
	case rec.Done:
		st, err = recordStream(*rec)
	case s.ownerAlive(req.Context(), rec.Owner):
		st, err = runningStream(*rec)
	default:
		st = s.takeOverResponse(w, req, rec.ID)
		if st == nil {
			return
		}
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, openai.ErrBadRequestRecord, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, st.responseObject())
}

// ownerAlive: the frontend that owns a record still holds its key (its
// lease). An unreadable key counts as alive: nothing is taken over on a
// guess.
func (s *Server) ownerAlive(ctx context.Context, owner string) bool {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	resp, err := s.etcd.Get(ctx, schema.FrontendsPrefix+owner, clientv3.WithCountOnly())
	return err != nil || resp.Count > 0
}

// takeOverResponse takes running response id over from its record and
// runs it here (takeOverFromRecord); nil when it answered for the
// caller.
func (s *Server) takeOverResponse(w http.ResponseWriter, req *http.Request, id string) *stream {
	st, done := s.takeOverFromRecord(w, req, id, func(result string) { s.metrics.takeovers.WithLabelValues(result).Inc() })
	if st != nil && !done {
		// Nobody follows it yet: a response that is not in the
		// background is reaped after the resume window unless a client
		// comes.
		st.clientGone()
	}
	return st
}

// cancelResponse cancels response id wherever it runs and waits (at most
// cancelWait) for its end; nil when it answered for the caller.
func (s *Server) cancelResponse(w http.ResponseWriter, req *http.Request, id string) *stream {
	ctx, cancel := context.WithTimeout(req.Context(), lookupTimeout)
	st, rec, err := s.findResponse(ctx, id, req)
	cancel()
	var rf *responseRefusal
	if errors.As(err, &rf) {
		rf.write(w)
		return nil
	}
	switch {
	case st != nil:
	case rec.Done:
		if st, err = recordStream(*rec); err != nil {
			writeError(w, http.StatusInternalServerError, openai.ErrBadRequestRecord, err.Error())
			return nil
		}
		return st
	default:
		if st = s.takeOverResponse(w, req, id); st == nil {
			return nil
		}
	}
	if done, _, _ := st.state(); done {
		return st
	}
	st.cancel(errClientCancelled)
	wait, stop := context.WithTimeout(req.Context(), cancelWait)
	defer stop()
	for {
		done, _, changed := st.state()
		if done {
			return st
		}
		select {
		case <-changed:
		case <-wait.Done():
			return st
		}
	}
}

// handleResponseCancel answers POST /v1/responses/{id}/cancel: the
// response, cancelled (its worker's sequence with it), or as it ended.
func (s *Server) handleResponseCancel(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	if st := s.cancelResponse(w, req, id); st != nil {
		awaitRecorded(req.Context(), st)
		writeJSON(w, http.StatusOK, st.responseObject())
	}
}

// handleResponseDelete answers DELETE /v1/responses/{id}: a running
// response is cancelled, then its record and log are dropped.
func (s *Server) handleResponseDelete(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	st := s.cancelResponse(w, req, id)
	if st == nil {
		return
	}
	awaitRecorded(req.Context(), st) // so that its end's write does not recreate it
	if s.recs != nil {
		ctx, cancel := context.WithTimeout(req.Context(), lookupTimeout)
		_, err := s.etcd.Delete(ctx, schema.RequestsPrefix+id)
		cancel()
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, openai.ErrTakeoverUnavailable, "the response's record cannot be deleted now: "+err.Error())
			return
		}
	}
	s.mu.Lock()
	delete(s.streams, id)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": openai.ResponseDeletedObject, "deleted": true})
}

// handleResponseInputItems answers GET /v1/responses/{id}/input_items:
// the response's input items, newest first unless order=asc, limit
// (1..100, default 20) after the item id after.
func (s *Server) handleResponseInputItems(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeParamError(w, invalid("limit", "%q: want an integer in [1, 100]", v))
			return
		}
		limit = n
	}
	order := q.Get("order")
	if order != "" && order != "asc" && order != "desc" {
		writeParamError(w, invalid("order", "%q: want asc or desc", order))
		return
	}
	ctx, cancel := context.WithTimeout(req.Context(), lookupTimeout)
	st, err := s.storedResponse(ctx, req.PathValue("id"), req)
	cancel()
	if rf, ok := err.(*responseRefusal); ok {
		rf.write(w)
		return
	} else if err != nil {
		writeError(w, http.StatusInternalServerError, openai.ErrBadRequestRecord, err.Error())
		return
	}
	items := append([]openai.OutputItem(nil), st.body.Response.Input...)
	if order != "asc" {
		for i, j := 0, len(items)-1; i < j; i, j = i+1, j-1 {
			items[i], items[j] = items[j], items[i]
		}
	}
	if after := q.Get("after"); after != "" {
		for i, it := range items {
			if it.ID == after {
				items = items[i+1:]
				break
			}
		}
	}
	more := len(items) > limit
	items = items[:min(limit, len(items))]
	out := map[string]any{"object": openai.ResponseInputItemsLists, "data": items, "has_more": more, "first_id": nil, "last_id": nil}
	if len(items) > 0 {
		out["first_id"], out["last_id"] = items[0].ID, items[len(items)-1].ID
	}
	writeJSON(w, http.StatusOK, out)
}
