package frontend

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// TestGroupRefusalNamesClientParam: a worker's refusal of one choice of a
// structured request of several choices is a 400 naming the client's
// parameter (response_format), not the worker's field, streamed or not.
func TestGroupRefusalNamesClientParam(t *testing.T) {
	refused := func() *group {
		g := &group{id: "p-c2", children: []*stream{choiceStream("p-c2", 0, 2), choiceStream("p-c2", 1, 2)}}
		for _, st := range g.children {
			st.body.Structured = &StructuredOutput{Kind: StructuredJSONSchema, Schema: []byte(`{"type":"string"}`)}
		}
		g.children[1].append(toks(1, "a"))
		g.children[0].finish(&reqfsm.Request{State: reqfsm.Failed, Err: &reqfsm.RequestError{Type: openai.ErrInvalidRequest,
			Message: "decode: invalid request: structured.schema: grammar: too large"}}, sse.Lifeline{})
		return g
	}
	g := refused()
	w := httptest.NewRecorder()
	if g.awaitStarts(w, httptest.NewRequest("POST", "/v1/completions", nil), &g.children[0].body) {
		t.Fatal("a refused choice started streaming")
	}
	if w.Code != 400 || !strings.Contains(w.Body.String(), `"param":"response_format"`) {
		t.Fatalf("streamed: %d %s", w.Code, w.Body)
	}
	g = refused()
	w = httptest.NewRecorder()
	(&Server{}).writeWholeGroup(w, httptest.NewRequest("POST", "/v1/completions", nil), g)
	if w.Code != 400 || !strings.Contains(w.Body.String(), `"param":"response_format"`) {
		t.Fatalf("whole: %d %s", w.Code, w.Body)
	}
}
