package frontend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// TestChoiceSeed: choice 0 keeps the request's seed; the others are a
// fixed function of (seed, index), distinct and in 0..2^63-1.
func TestChoiceSeed(t *testing.T) {
	if ChoiceSeed(42, 0) != 42 {
		t.Fatal("choice 0 must keep the request's seed")
	}
	// Pinned: a migrated or taken-over choice, or another frontend
	// version, must sample with exactly these.
	for _, c := range []struct {
		seed uint64
		i    int
		want uint64
	}{{42, 1, 6839728766377637706}, {42, 2, 1474913046063446145}, {0, 1, 8147104208329303767}} {
		if got := ChoiceSeed(c.seed, c.i); got != c.want {
			t.Fatalf("ChoiceSeed(%d, %d) = %d, want %d", c.seed, c.i, got, c.want)
		}
	}
	seen := map[uint64]bool{}
	for _, seed := range []uint64{0, 1, 42, 1<<63 - 1} {
		for i := range maxChoices {
			s := ChoiceSeed(seed, i)
			if s>>63 != 0 {
				t.Fatalf("seed %d choice %d: %d past 2^63-1", seed, i, s)
			}
			if seen[s] && i > 0 {
				t.Fatalf("seed %d choice %d: %d repeats", seed, i, s)
			}
			seen[s] = true
		}
	}
}

// TestChoicesParse: n, best_of and prompt arrays, their bounds and their
// refusals.
func TestChoicesParse(t *testing.T) {
	for _, tc := range []struct {
		name, body  string
		chat        bool
		param, code string
		count       int
	}{
		{name: "n 2", body: `{"model":"m","prompt":"a","n":2}`, count: 2},
		{name: "chat n 3", chat: true, body: `{"model":"m","messages":[{"role":"user","content":"a"}],"n":3}`, count: 3},
		{name: "best_of = n", body: `{"model":"m","prompt":"a","n":2,"best_of":2}`, count: 2},
		{name: "best_of > n", body: `{"model":"m","prompt":"a","n":2,"best_of":3}`, param: "best_of", code: CodeUnsupportedParameter},
		{name: "best_of < n", body: `{"model":"m","prompt":"a","n":3,"best_of":2}`, param: "best_of", code: CodeInvalidValue},
		{name: "n 0", body: `{"model":"m","prompt":"a","n":0}`, param: "n", code: CodeInvalidValue},
		{name: "n past the bound", body: `{"model":"m","prompt":"a","n":17}`, param: "n", code: CodeInvalidValue},
		{name: "n wraps", body: `{"model":"m","prompt":"a","n":4294967298}`, param: "n", code: CodeInvalidValue},
		{name: "n fraction", body: `{"model":"m","prompt":"a","n":1.5}`, param: "n", code: CodeInvalidValue},
		{name: "two prompts", body: `{"model":"m","prompt":["a","b"]}`, count: 2},
		{name: "two prompts n 2", body: `{"model":"m","prompt":["a","b"],"n":2}`, count: 4},
		{name: "token batches", body: `{"model":"m","prompt":[[1,2],[3]],"n":2}`, count: 4},
		{name: "one token batch", body: `{"model":"m","prompt":[[1,2]]}`, count: 1},
		{name: "empty prompt array", body: `{"model":"m","prompt":[]}`, param: "prompt", code: CodeInvalidValue},
		{name: "empty prompt in batch", body: `{"model":"m","prompt":["a",""]}`, param: "prompt[1]", code: CodeInvalidValue},
		{name: "empty ids in batch", body: `{"model":"m","prompt":[[1],[]]}`, param: "prompt[1]", code: CodeInvalidValue},
		{name: "id past int32 in batch", body: `{"model":"m","prompt":[[1],[4294967297]]}`, param: "prompt[1]", code: CodeInvalidValue},
		{name: "too many prompts", body: `{"model":"m","prompt":[` + strings.Repeat(`"a",`, maxBatchPrompts) + `"a"]}`, param: "prompt", code: CodeInvalidValue},
		{name: "too many choices", body: `{"model":"m","prompt":["a","b","c","d","e"],"n":16}`, param: "n", code: CodeInvalidValue},
		{name: "mixed array", body: `{"model":"m","prompt":["a",[1]]}`, param: "prompt", code: CodeInvalidValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := parseRequest([]byte(tc.body), tc.chat)
			if err == nil {
				err = b.validate()
			}
			if tc.param == "" {
				if err != nil || b.choiceCount() != tc.count {
					t.Fatalf("%v, %d choices, want %d", err, b.choiceCount(), tc.count)
				}
				return
			}
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Param != tc.param || pe.Code != tc.code || pe.Message == "" {
				t.Fatalf("got %#v (%v), want param %q code %q", pe, err, tc.param, tc.code)
			}
		})
	}
}

// TestChildren: choice i = prompt_index·n + j, each with its prompt, its
// seed and its place; a child is an ordinary request.
func TestChildren(t *testing.T) {
	b, err := parseRequest([]byte(`{"model":"m","prompt":["x","y"],"n":2,"seed":7}`), false)
	if err != nil {
		t.Fatal(err)
	}
	id := groupID("cmpl-1-1", b.choiceCount())
	kids := b.children(id)
	wantPrompt := []string{"x", "x", "y", "y"}
	for i, c := range kids {
		if c.Prompt != wantPrompt[i] || c.Seed != ChoiceSeed(7, i) || c.Choice.Index != i || c.Choice.Count != 4 || c.Choice.Prompt != i/2 ||
			c.choiceCount() != 1 || c.validate() != nil || c.Choice.Parent != id {
			t.Fatalf("child %d: %+v", i, c)
		}
	}
	if kids[0].Seed != 7 {
		t.Fatal("choice 0 must keep the seed")
	}
}

// TestGroupID: the number of choices is read back from a parent's id,
// and from no other id.
func TestGroupID(t *testing.T) {
	id := groupID("chatcmpl-17-3", 4)
	if groupCount(id) != 4 || groupCount(childID(id, 1)) != 0 {
		t.Fatalf("%s: %d", id, groupCount(id))
	}
	for _, plain := range []string{"cmpl-17-3", "chatcmpl-1-2", "x-c1", "x-c", "x-c07", "x-c65", "x-c4.1", "x-c4x", "x-c9999"} {
		if groupCount(plain) != 0 {
			t.Fatalf("%q read as a group of %d", plain, groupCount(plain))
		}
	}
}

// choiceStream is a running child stream for the multiplexer tests.
func choiceStream(parent string, i, count int) *stream {
	body := CompletionRequest{Model: "m", Choice: &ChoiceOf{Parent: parent, Index: i, Count: count}}
	body.StreamOptions.IncludeUsage = true
	return newStream(childID(parent, i), body, false, true, func(error) {})
}

func toks(from int, texts ...string) []reqfsm.Token {
	out := make([]reqfsm.Token, len(texts))
	for i, s := range texts {
		out[i] = reqfsm.Token{SequenceNo: from + i, ID: from + i, Text: s}
	}
	return out
}

// readGroup parses a multiplexed stream: each choice's text, each event's
// id, the finish chunks by choice, and whether it ended with [DONE].
func readGroup(t *testing.T, data []byte, k int) (texts []string, ids []string, finishes []int, usage *sse.Usage) {
	t.Helper()
	texts = make([]string, k)
	last := make([]int, k)
	rd := sse.NewReader(bytes.NewReader(data))
	for {
		ev, err := rd.Next()
		if err != nil {
			return
		}
		c := ev.Chunk
		if c == nil {
			t.Fatalf("error event %+v", ev.Error)
		}
		if c.Usage != nil {
			usage = c.Usage
			continue
		}
		i := c.Choices[0].Index
		if c.ID != "p-c2" || c.Lifeline.RequestID != "p-c2" {
			t.Fatalf("chunk of %q", c.ID)
		}
		ids = append(ids, ev.ID)
		pos, err := sse.ParsePositions(ev.ID, k)
		if err != nil {
			t.Fatalf("event id %q: %v", ev.ID, err)
		}
		if c.Finish() != "" {
			finishes = append(finishes, i)
			continue
		}
		// The id's position of the chunk's choice is its token.
		if seq := c.Lifeline.SequenceNo; seq != last[i]+1 || pos[i] != seq {
			t.Fatalf("choice %d: token %d after %d (id %q)", i, seq, last[i], ev.ID)
		}
		last[i] = c.Lifeline.SequenceNo
		texts[i] += c.Content()
	}
}

// TestGroupMultiplex: every event id holds every choice's position, the
// positions never go back, each choice's tokens come in order with one
// finish each, and a resume from any event's id gives exactly the rest.
func TestGroupMultiplex(t *testing.T) {
	g := &group{id: "p-c2", children: []*stream{choiceStream("p-c2", 0, 2), choiceStream("p-c2", 1, 2)}}
	g.children[0].append(toks(1, "a", "b"))
	g.children[1].append(toks(1, "X"))
	g.children[1].append(toks(2, "Y", "Z"))
	g.children[0].append(toks(3, "c"))
	for i, st := range g.children {
		st.finish(&reqfsm.Request{State: reqfsm.Completed, FinishReason: "length", Output: st.tokens.View()}, sse.Lifeline{RequestID: st.id})
		_ = i
	}
	var full bytes.Buffer
	if !g.writeFrom(context.Background(), sse.NewWriter(&full), nil, make([]int, 2), nil) {
		t.Fatal("client gone")
	}
	texts, ids, finishes, usage := readGroup(t, full.Bytes(), 2)
	if !slices.Equal(texts, []string{"abc", "XYZ"}) || len(finishes) != 2 || !strings.HasSuffix(full.String(), "data: [DONE]\n\n") {
		t.Fatalf("texts %q finishes %v\n%s", texts, finishes, full.String())
	}
	if usage == nil || usage.CompletionTokens != 6 {
		t.Fatalf("usage %+v", usage)
	}
	prev := []int{0, 0}
	for _, id := range ids {
		pos, _ := sse.ParsePositions(id, 2)
		if pos[0] < prev[0] || pos[1] < prev[1] {
			t.Fatalf("positions went back: %v after %v", pos, prev)
		}
		prev = pos
	}
	// Resume after each event: exactly the events that followed it.
	for n, id := range ids {
		pos, _ := sse.ParsePositions(id, 2)
		var rest bytes.Buffer
		rids := readGroupFrom(t, &rest, g, pos)
		if !slices.Equal(rids, ids[n+1:]) {
			t.Fatalf("after %q: %q, want %q", id, rids, ids[n+1:])
		}
	}
}

// TestGroupMultiplexLive: choices that grow while followed come out
// interleaved as they arrive, each in order, the end once all finished.
func TestGroupMultiplexLive(t *testing.T) {
	g := &group{id: "p-c2", children: []*stream{choiceStream("p-c2", 0, 2), choiceStream("p-c2", 1, 2)}}
	pr, pw := io.Pipe()
	go func() {
		g.writeFrom(context.Background(), sse.NewWriter(pw), nil, make([]int, 2), nil)
		pw.Close()
	}()
	rd := sse.NewReader(pr)
	next := func() *sse.Chunk {
		ev, err := rd.Next()
		if err != nil || ev.Chunk == nil {
			t.Fatalf("%v %+v", err, ev)
		}
		return ev.Chunk
	}
	for seq := 1; seq <= 3; seq++ {
		for i, st := range g.children {
			st.append(toks(seq, fmt.Sprint(i, seq)))
			if c := next(); c.Choices[0].Index != i || c.Lifeline.SequenceNo != seq {
				t.Fatalf("want choice %d token %d, got choice %d token %d", i, seq, c.Choices[0].Index, c.Lifeline.SequenceNo)
			}
		}
	}
	g.children[1].finish(&reqfsm.Request{State: reqfsm.Completed, FinishReason: "stop", Output: g.children[1].tokens}, sse.Lifeline{})
	if c := next(); c.Choices[0].Index != 1 || c.Finish() != "stop" {
		t.Fatalf("finish of choice 1: %+v", c)
	}
	g.children[0].finish(&reqfsm.Request{State: reqfsm.Completed, FinishReason: "length", Output: g.children[0].tokens}, sse.Lifeline{})
	if c := next(); c.Choices[0].Index != 0 || c.Finish() != "length" {
		t.Fatalf("finish of choice 0: %+v", c)
	}
	if c := next(); c.Usage == nil || c.Usage.CompletionTokens != 6 {
		t.Fatalf("usage: %+v", c)
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Fatalf("after the usage: %v, want [DONE]", err)
	}
}

// TestGroupFailure: a choice that fails for good ends the response with
// its error (not the cancel it caused in the others) and cancels the
// others; a stopping frontend cancels none.
func TestGroupFailure(t *testing.T) {
	var cancelled []error
	g := &group{id: "p-c2", children: []*stream{choiceStream("p-c2", 0, 2), choiceStream("p-c2", 1, 2)}}
	g.children[0].cancel = func(err error) { cancelled = append(cancelled, err) }
	g.children[0].append(toks(1, "a"))
	g.children[1].finish(&reqfsm.Request{State: reqfsm.Failed, Err: &reqfsm.RequestError{Type: openai.ErrMigrationExhausted, Message: "x"}}, sse.Lifeline{})
	var out bytes.Buffer
	g.writeFrom(context.Background(), sse.NewWriter(&out), nil, make([]int, 2), nil)
	if !strings.Contains(out.String(), `"type":"migration_exhausted"`) || !strings.HasSuffix(out.String(), "data: [DONE]\n\n") ||
		len(cancelled) != 1 || cancelled[0] != errSiblingFailed {
		t.Fatalf("cancelled %v\n%s", cancelled, out.String())
	}
	rs := []*reqfsm.Request{{Err: &reqfsm.RequestError{Type: openai.ErrCancelledType}}, {Err: &reqfsm.RequestError{Type: openai.ErrMigrationExhausted}}}
	if e, failed := g.failure(rs); !failed || e.Type != openai.ErrMigrationExhausted {
		t.Fatalf("%+v %v", e, failed)
	}
	if _, failed := g.failure([]*reqfsm.Request{nil, {Err: &reqfsm.RequestError{Type: openai.ErrFrontendStopping}}}); failed {
		t.Fatal("a stopping frontend ends no choice for good")
	}
}

// readGroupFrom writes g after pos into w and returns the events' ids,
// checking each choice's tokens follow on from pos.
func readGroupFrom(t *testing.T, w *bytes.Buffer, g *group, pos []int) []string {
	t.Helper()
	last := slices.Clone(pos)
	g.writeFrom(context.Background(), sse.NewWriter(w), nil, pos, nil)
	rd := sse.NewReader(w)
	var ids []string
	for {
		ev, err := rd.Next()
		if err != nil {
			return ids
		}
		c := ev.Chunk
		if c.Usage != nil {
			continue
		}
		ids = append(ids, ev.ID)
		if i := c.Choices[0].Index; c.Finish() == "" {
			if c.Lifeline.SequenceNo != last[i]+1 {
				t.Fatalf("choice %d: %d after %d", i, c.Lifeline.SequenceNo, last[i])
			}
			last[i]++
		}
	}
}
