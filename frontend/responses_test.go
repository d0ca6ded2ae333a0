package frontend

import (
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
)

// respEv is one event of a response's stream as written.
type respEv struct {
	id, typ string
	ev      openai.Event
	errEv   openai.ErrorEvent
}

// responseEvents are st's events after sequence number after, as
// follow writes them.
func responseEvents(t *testing.T, st *stream, after int) []respEv {
	t.Helper()
	w := httptest.NewRecorder()
	(&Server{}).follow(w, httptest.NewRequest("GET", "/", nil), st, after, false)
	var out []respEv
	for _, block := range strings.Split(w.Body.String(), "\n\n") {
		var e respEv
		data := ""
		for _, line := range strings.Split(block, "\n") {
			switch k, v, _ := strings.Cut(line, ": "); k {
			case "id":
				e.id = v
			case "event":
				e.typ = v
			case "data":
				data = v
			}
		}
		if data == "" {
			continue
		}
		if err := json.Unmarshal([]byte(data), &e.ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		json.Unmarshal([]byte(data), &e.errEv)
		out = append(out, e)
	}
	return out
}

func responseStream(id string, body CompletionRequest, output []reqfsm.Token, reason string, err *reqfsm.RequestError) *stream {
	body.Response = &responseMeta{Store: true, Text: json.RawMessage(`{"format":{"type":"text"}}`), ToolChoice: json.RawMessage(`"auto"`), Tools: json.RawMessage(`[]`)}
	st := finishedWith(id, body, true, output, reason)
	if err != nil {
		_, r, _ := st.state()
		r.Err, r.State = err, reqfsm.Failed
	}
	return st
}

// TestResponseEventsResumeAnywhere: a response's events are numbered
// from 0, contiguous, each with its number as the SSE id and its type as
// the event name; a resume after any number N gets exactly the events
// after N; the deltas join to the output; the end says why it ended.
func TestResponseEventsResumeAnywhere(t *testing.T) {
	st := responseStream("resp_1", CompletionRequest{Model: "m"}, textToks(" once", " upon", "", " a", " time"), "length", nil)
	all := responseEvents(t, st, -1)
	var text strings.Builder
	for i, e := range all {
		if e.ev.SequenceNumber != i || e.id != strconv.Itoa(i) || e.typ != e.ev.Type {
			t.Fatalf("event %d: id %q, event %q, %+v", i, e.id, e.typ, e.ev)
		}
		if e.ev.Type == openai.EventOutputTextDelta {
			text.WriteString(*e.ev.Delta)
		}
	}
	last := all[len(all)-1].ev
	if text.String() != " once upon a time" || last.Type != openai.EventIncomplete || last.Response.Status != openai.StatusIncomplete ||
		last.Response.IncompleteDetails.Reason != "max_output_tokens" || last.Response.Usage.OutputTokens != 5 ||
		last.Response.Output[0].Content[0].Text != " once upon a time" {
		t.Fatalf("text %q, end %+v", text.String(), last)
	}
	for after := -1; after < len(all); after++ {
		got, want := responseEvents(t, st, after), all[after+1:]
		if len(got) != len(want) || len(got) > 0 && !reflect.DeepEqual(got, want) {
			t.Fatalf("after %d: %d events, want the last %d", after, len(got), len(all)-after-1)
		}
	}
	if obj := st.responseObject(); !reflect.DeepEqual(obj, *last.Response) {
		t.Fatalf("object %+v\nend event's %+v", obj, *last.Response)
	}
}

// TestResponseFunctionCalls: parallel calls are items of their own, each
// whole in one arguments delta, with the call ids Chat Completions gives.
func TestResponseFunctionCalls(t *testing.T) {
	body := CompletionRequest{Model: "m", ToolCalls: &ToolCalls{Parallel: true}}
	st := responseStream("resp_2", body, textToks(`{"tool_calls":[`, `{"f":{"x":1}}`, `,{"g":{}}`, `]}`), "stop", nil)
	var items []openai.OutputItem
	for _, e := range responseEvents(t, st, -1) {
		if e.ev.Type == openai.EventOutputItemDone {
			items = append(items, *e.ev.Item)
		}
	}
	want := []openai.OutputItem{
		{ID: "fc_2_0", Type: openai.ItemFunctionCall, Status: openai.StatusCompleted, CallID: callID("resp_2", 0), Name: "f", Arguments: `{"x":1}`},
		{ID: "fc_2_1", Type: openai.ItemFunctionCall, Status: openai.StatusCompleted, CallID: callID("resp_2", 1), Name: "g", Arguments: `{}`},
	}
	if !reflect.DeepEqual(items, want) {
		t.Fatalf("items %+v\nwant %+v", items, want)
	}
	if obj := st.responseObject(); obj.Status != openai.StatusCompleted || !reflect.DeepEqual(obj.Output, want) {
		t.Fatalf("object %+v", obj)
	}
}

// TestResponseEnds: a cancelled response ends with response.failed and
// status cancelled; a failed one with its error's type as the code; one
// taken over by another frontend has no end here, only an error event
// (no sequence number) naming what happened.
func TestResponseEnds(t *testing.T) {
	for _, c := range []struct {
		err               reqfsm.RequestError
		typ, status, code string
	}{
		{reqfsm.RequestError{Type: openai.ErrCancelledType, Message: "cancelled by the client"}, openai.EventFailed, openai.StatusCancelled, "cancelled"},
		{reqfsm.RequestError{Type: openai.ErrMigrationExhausted, Message: "no worker"}, openai.EventFailed, openai.StatusFailed, "migration_exhausted"},
		{reqfsm.RequestError{Type: openai.ErrTakenOver, Message: "taken over"}, openai.EventError, "", "taken_over"},
	} {
		st := responseStream("resp_3", CompletionRequest{Model: "m"}, textToks(" a"), "", &c.err)
		evs := responseEvents(t, st, -1)
		last := evs[len(evs)-1]
		switch {
		case last.typ != c.typ:
			t.Errorf("%s: last event %s, want %s", c.code, last.typ, c.typ)
		case c.typ == openai.EventError && (last.errEv.Code != c.code || last.id != "" || strings.Contains(last.typ, "response.")):
			t.Errorf("%s: error event %+v (id %q)", c.code, last.errEv, last.id)
		case c.typ != openai.EventError && (last.ev.Response.Status != c.status || last.ev.Response.Error.Code != c.code):
			t.Errorf("%s: end %+v", c.code, last.ev.Response)
		}
	}
}

// TestResponseRequestRefusals: known, unserved fields are refused naming
// them; the input's items are read with their roles and parts.
func TestResponseRequestRefusals(t *testing.T) {
	for body, param := range map[string]string{
		`{"model":"m","input":"x","reasoning":{"effort":"low"}}`:           "reasoning",
		`{"model":"m","input":"x","truncation":"auto"}`:                    "truncation",
		`{"model":"m","input":"x","include":["file_search_call.results"]}`: "include",
		`{"model":"m","input":"x","tools":[{"type":"file_search"}]}`:       "tools[0].type",
		`{"model":"m"}`: "input",
		`{"input":"x"}`: "model",
		`{"model":"m","input":[{"role":"robot","content":"x"}]}`:               "input[0].role",
		`{"model":"m","input":"x","background":true,"store":false}`:            "store",
		`{"model":"m","input":[{"type":"function_call_output","output":"1"}]}`: "input[0].call_id",
	} {
		r, err := openai.ParseResponseRequest([]byte(body))
		if err == nil {
			_, err = openai.InputItems(r.Input, "in")
		}
		pe, ok := err.(*openai.ParamError)
		if !ok || pe.Param != param {
			t.Errorf("%s: %v, want a refusal naming %s", body, err, param)
		}
	}
	items, err := openai.InputItems(json.RawMessage(`[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
		{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"7"}]`), "in")
	if err != nil || len(items) != 3 || openai.PartsText(items[0].Content) != "ab" || items[1].Name != "f" || items[2].Output != "7" || items[0].ID != "in_0" {
		t.Fatalf("items %+v, %v", items, err)
	}
	msgs := itemMessages(items)
	if len(msgs) != 3 || msgs[1]["role"] != "assistant" || msgs[2]["tool_call_id"] != "c1" {
		t.Fatalf("chat messages %v", msgs)
	}
}

// TestResponseCallCutShort: a call output cut before any call closed is
// delivered as its text (as in Chat Completions), in the events and the
// object.
func TestResponseCallCutShort(t *testing.T) {
	body := CompletionRequest{Model: "m", ToolCalls: &ToolCalls{}}
	st := responseStream("resp_4", body, textToks(`{"f":`, `{"x`), "length", nil)
	var text strings.Builder
	for _, e := range responseEvents(t, st, -1) {
		if e.ev.Type == openai.EventOutputTextDelta {
			text.WriteString(*e.ev.Delta)
		}
	}
	obj := st.responseObject()
	if text.String() != `{"f":{"x` || len(obj.Output) != 1 || obj.Output[0].Type != openai.ItemMessage || obj.Output[0].Content[0].Text != `{"f":{"x` {
		t.Fatalf("text %q, object output %+v", text.String(), obj.Output)
	}
}

// TestResponseCredentials: the bearer token's scheme in any case, another
// scheme's whole value, none: three different owners.
func TestResponseCredentials(t *testing.T) {
	cred := func(h string) string {
		r := httptest.NewRequest("GET", "/", nil)
		if h != "" {
			r.Header.Set("Authorization", h)
		}
		return credentialOf(r)
	}
	if cred("Bearer k1") != cred("bearer  k1") || cred("Bearer k1") == cred("Bearer k2") || cred("Basic k1") == cred("Bearer k1") ||
		cred("Basic k1") == "" || cred("") != "" || cred("Bearer ") != "" {
		t.Fatal("credentials confused")
	}
}

// TestResponsesParamNames: a refusal of the chat request names the
// Responses parameter: the input item, the instructions, the continued
// conversation, text.format, max_output_tokens.
func TestResponsesParamNames(t *testing.T) {
	for in, want := range map[string]string{
		"messages[3].content":                "input[1].content",
		"messages[0].content":                "instructions",
		"messages[1].role":                   "previous_response_id",
		"response_format.json_schema.schema": "text.format.schema",
		"max_tokens":                         "max_output_tokens",
		"tools[0].function.parameters":       "tools[0].parameters",
	} {
		err := responsesParamAt(&ParamError{Param: in}, 2, true)
		if got := err.(*ParamError).Param; got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}
