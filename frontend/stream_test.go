package frontend

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// TestTimeline: a migration's points are kept from its first route to its
// first token (a re-route keeps the start), and the P/D hand-off renders
// in milliseconds to the microsecond.
func TestTimeline(t *testing.T) {
	var tl timeline
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tl.markRouted(at(1)) // no migration: nothing marked
	if _, ok := tl.markRecovered(at(2)); ok || tl.lastMigration() != nil {
		t.Fatal("a recovery without a migration")
	}
	tl.migrating(at(10))
	tl.markRouted(at(11))
	tl.migrating(at(12)) // the route failed; routed again
	tl.markRouted(at(13))
	tl.markDispatched(at(14))
	if tl.lastMigration() != nil {
		t.Fatal("timeline before the first token")
	}
	took, ok := tl.markRecovered(at(20))
	want := map[string]int64{"failure_seen_unix_ns": at(10).UnixNano(), "routed_unix_ns": at(13).UnixNano(),
		"dispatched_unix_ns": at(14).UnixNano(), "first_token_unix_ns": at(20).UnixNano()}
	if !ok || took != 10*time.Millisecond || !reflect.DeepEqual(tl.lastMigration(), want) {
		t.Fatalf("took %v, %v", took, tl.lastMigration())
	}
	tl.markDispatched(at(30)) // after the recovery: not the migration's
	if tl.lastMigration()["dispatched_unix_ns"] != at(14).UnixNano() {
		t.Fatal("dispatch after the recovery marked")
	}

	tl.markPrefillSent(t0)
	tl.markPrefilled(t0.Add(1234567 * time.Nanosecond))
	tl.markTransferSent(t0)
	tl.markDecodeSent(t0)
	tl.markFirstToken(t0.Add(2 * time.Millisecond))
	tl.markFirstToken(t0.Add(9 * time.Millisecond)) // only the first counts
	if got := tl.pdMs(); !reflect.DeepEqual(got, map[string]float64{"prefill": 1.234, "transfer": 0, "decode_first_token": 2}) {
		t.Fatalf("pd timeline %v", got)
	}
}

// append adds toks to st's log, as a run's publish of a grown log does.
func (st *stream) append(toks []reqfsm.Token) {
	st.mu.Lock()
	for _, t := range toks {
		st.tokens.Add(t)
	}
	close(st.changed)
	st.changed = make(chan struct{})
	st.mu.Unlock()
}

// finished is a stream whose request completed with two tokens after a
// migration and a P/D hand-off.
func finished(chat bool) *stream {
	st := newStream("cmpl-1", CompletionRequest{Model: "m"}, chat, false, func(error) {})
	r := reqfsm.NewRequest("cmpl-1", []int{1}, 2, time.Time{}, reqfsm.DefaultPolicy, t0)
	r.Output = logOf([]reqfsm.Token{{SequenceNo: 1, ID: 7, Text: " a", Instance: "d0"}, {SequenceNo: 2, ID: 8, Text: " b", Instance: "d1"}})
	r.State, r.FinishReason, r.Migrations, r.PD = reqfsm.Completed, "length", 1, "same_node"
	st.publish(r.Output.View())
	x := &run{r: r}
	x.tl.migrating(t0)
	x.tl.markRecovered(t0.Add(time.Millisecond))
	st.finish(r, x.summary())
	return st
}

// TestStreamEnd: a follower gets every token after the one it saw, then
// the end chunk with the request's summary (each field present, zero or
// not), then [DONE]; a failed request ends with its typed error.
func TestStreamEnd(t *testing.T) {
	for _, chat := range []bool{false, true} {
		st := finished(chat)
		w := httptest.NewRecorder()
		(&Server{}).follow(w, httptest.NewRequest("GET", "/v1/streams/cmpl-1", nil), st, 1, false)
		rd := sse.NewReader(w.Body)
		ev, err := rd.Next()
		if err != nil || ev.ID != "2" || ev.Chunk.Content() != " b" || ev.Chunk.Lifeline.TokenID != 8 || ev.Chunk.Lifeline.InstanceID != "d1" || ev.Chunk.Finish() != "" {
			t.Fatalf("token: %+v %v", ev, err)
		}
		ev, err = rd.Next()
		if err != nil || ev.ID != "" || ev.Chunk.Finish() != "length" || ev.Chunk.Content() != "" {
			t.Fatalf("end: %+v %v", ev, err)
		}
		var raw struct{ Lifeline map[string]any }
		json.Unmarshal(ev.Data, &raw)
		keys := slices.Sorted(maps.Keys(raw.Lifeline))
		if strings.Join(keys, " ") != "kv_reused_positions kv_transfer_bytes last_migration migrations pd pd_timeline_ms request_id" {
			t.Fatalf("end chunk's lifeline %v", raw.Lifeline)
		}
		if _, err := rd.Next(); err != io.EOF {
			t.Fatalf("[DONE]: %v", err)
		}
	}

	st := newStream("cmpl-2", CompletionRequest{Model: "m"}, false, false, func(error) {})
	r := reqfsm.NewRequest("cmpl-2", []int{1}, 2, time.Time{}, reqfsm.DefaultPolicy, t0)
	r.State, r.Err = reqfsm.Failed, &reqfsm.RequestError{Type: openai.ErrMigrationExhausted, Message: "3 migrations used"}
	st.finish(r, (&run{r: r}).summary())
	w := httptest.NewRecorder()
	(&Server{}).follow(w, httptest.NewRequest("GET", "/", nil), st, 0, false)
	ev, err := sse.NewReader(w.Body).Next()
	if err != nil || ev.Error == nil || ev.Error.Type != "migration_exhausted" || ev.Error.Message != "3 migrations used" {
		t.Fatalf("error event: %+v %v", ev, err)
	}
}

// TestWholeResponse: a request that was not streamed gets the summary
// without the migration timeline, and the number of tokens.
func TestWholeResponse(t *testing.T) {
	st := finished(false)
	w := httptest.NewRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	(&Server{}).writeWhole(w, httptest.NewRequest("POST", "/v1/completions", nil).WithContext(ctx), st)
	var res struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		}
		Lifeline map[string]any
	}
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Text != " a b" || res.Choices[0].FinishReason != "length" || res.Lifeline["tokens"] != float64(2) ||
		res.Lifeline["migrations"] != float64(1) || res.Lifeline["pd"] != "same_node" || res.Lifeline["last_migration"] != nil || len(res.Lifeline) != 7 {
		t.Fatalf("whole response %s", w.Body.String())
	}
}
