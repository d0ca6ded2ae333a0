package decode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
)

// testSchema is a realistic object schema: a property of each type, an
// enum, an array, a nested object, some required.
const testSchema = `{"type":"object","properties":{
	"name":{"type":"string"},
	"age":{"type":"integer"},
	"score":{"type":"number"},
	"active":{"type":"boolean"},
	"color":{"enum":["red","green","blue"]},
	"tags":{"type":"array","items":{"type":"string"},"maxItems":3},
	"address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"integer"}},"required":["city"]}},
	"required":["name","age","color"]}`

func compileSchema(t testing.TB, schema string) *grammar.Automaton {
	t.Helper()
	a, err := grammar.Compile([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// checkValue validates v (decoded with UseNumber) against the subset used
// by these tests: an independent reading of the schema.
func checkValue(s map[string]any, v any) error {
	if e, ok := s["enum"].([]any); ok {
		if !slices.Contains(e, v) {
			return fmt.Errorf("%v not in %v", v, e)
		}
		return nil
	}
	switch s["type"] {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%v is not an object", v)
		}
		props, _ := s["properties"].(map[string]any)
		req, _ := s["required"].([]any)
		for _, r := range req {
			if _, ok := m[r.(string)]; !ok {
				return fmt.Errorf("required %q missing in %v", r, m)
			}
		}
		for k, e := range m {
			sub, ok := props[k].(map[string]any)
			if !ok {
				return fmt.Errorf("additional property %q", k)
			}
			if err := checkValue(sub, e); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
	case "array":
		l, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%v is not an array", v)
		}
		if n, ok := s["maxItems"].(json.Number); ok {
			if max, _ := n.Int64(); int64(len(l)) > max {
				return fmt.Errorf("%d items", len(l))
			}
		}
		for _, e := range l {
			if err := checkValue(s["items"].(map[string]any), e); err != nil {
				return err
			}
		}
	case "string":
		if _, ok := v.(string); !ok {
			return fmt.Errorf("%v is not a string", v)
		}
	case "integer", "number":
		n, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%v is not a number", v)
		}
		if _, err := n.Int64(); s["type"] == "integer" && err != nil {
			return fmt.Errorf("%v is not an integer", v)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%v is not a boolean", v)
		}
	}
	return nil
}

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errors.New("trailing data")
	}
	return v, nil
}

func textOf(r result) string {
	var b strings.Builder
	for _, ev := range r.events {
		b.WriteString(ev.Text)
	}
	return b.String()
}

// TestStructuredOutputValidates: with the synthetic weights, greedy and at
// temperature 1, over several seeds and budgets, a json_schema run ends
// with stop on a value that parses and validates, and a json_object run
// on an object.
func TestStructuredOutputValidates(t *testing.T) {
	e := newTinyEngine(t)
	a := compileSchema(t, testSchema)
	var raw map[string]any
	d := json.NewDecoder(strings.NewReader(testSchema))
	d.UseNumber()
	if err := d.Decode(&raw); err != nil {
		t.Fatal(err)
	}
	minClose := a.MinClose(a.Start())
	type run struct {
		r  Request
		ch <-chan Event
	}
	var runs []run
	for seed := range uint64(6) {
		for _, temp := range []float64{0, 1} {
			for _, auto := range []*grammar.Automaton{a, grammar.JSONObject()} {
				r := Request{Prompt: "Give me a person as JSON:", MaxTokens: minClose + int(seed*13),
					Sampling: sample.Params{Temperature: temp, Seed: seed}, Structured: &Structured{Automaton: auto}}
				ch, err := e.Generate(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				runs = append(runs, run{r, ch})
			}
		}
	}
	for _, ru := range runs {
		got := collect(t, ru.ch)
		out := textOf(got)
		name := fmt.Sprintf("seed %d temp %v json_object %v", ru.r.Sampling.Seed, ru.r.Sampling.Temperature, ru.r.Structured.Automaton == grammar.JSONObject())
		if got.finish.FinishReason != sched.FinishStop || got.finish.Err != nil {
			t.Fatalf("%s: finish %+v after %q", name, got.finish, out)
		}
		if last := got.events[len(got.events)-1]; last.FinishReason != sched.FinishStop {
			t.Fatalf("%s: last token's finish %q", name, last.FinishReason)
		}
		v, err := decodeJSON([]byte(out))
		if err != nil {
			t.Fatalf("%s: %q does not parse: %v", name, out, err)
		}
		if ru.r.Structured.Automaton == a {
			err = checkValue(raw, v)
		} else if _, ok := v.(map[string]any); !ok {
			err = errors.New("not an object")
		}
		if err != nil {
			t.Fatalf("%s: %q does not validate: %v", name, out, err)
		}
		t.Logf("%s: %s", name, out)
	}
}

// TestStructuredContinuationBitExact: a structured run with logprobs,
// continued from every prefix k (a migration after k tokens), produces
// the same tokens, text, logprobs and top logprobs, bit for bit.
func TestStructuredContinuationBitExact(t *testing.T) {
	t.Parallel()
	e := newTinyEngine(t)
	a := compileSchema(t, testSchema)
	for _, temp := range []float64{0, 1} {
		base := Request{Prompt: "JSON please", MaxTokens: a.MinClose(a.Start()) + 30, Logprobs: true, TopLogprobs: 5,
			Sampling: sample.Params{Temperature: temp, Seed: 77, TopP: 0.9}, Structured: &Structured{Automaton: a}}
		full := generate(t, e, base)
		ids := make([]int, len(full.events))
		for i, ev := range full.events {
			ids[i] = ev.TokenID
		}
		chans := make([]<-chan Event, len(ids))
		for k := range ids {
			r := base
			r.PrefixTokens = ids[:k]
			ch, err := e.Generate(context.Background(), r)
			if err != nil {
				t.Fatalf("temp %v k=%d: %v", temp, k, err)
			}
			chans[k] = ch
		}
		for k, ch := range chans {
			got := collect(t, ch)
			if len(got.events) != len(ids)-k || got.finish.FinishReason != full.finish.FinishReason {
				t.Fatalf("temp %v k=%d: %d tokens, finish %s; want %d, %s", temp, k, len(got.events), got.finish.FinishReason, len(ids)-k, full.finish.FinishReason)
			}
			for i, ev := range got.events {
				want := full.events[k+i]
				if ev.TokenID != want.TokenID || ev.Text != want.Text || ev.FinishReason != want.FinishReason ||
					math.Float64bits(ev.Logprob) != math.Float64bits(want.Logprob) || !slices.Equal(ev.TopLogprobs, want.TopLogprobs) {
					t.Fatalf("temp %v k=%d: event %d = %+v, want %+v", temp, k, i, ev, want)
				}
			}
		}
	}
}

// TestLogprobs: the top alternatives are ordered, the greedy token is the
// first of them, and nothing is computed when not asked.
func TestLogprobs(t *testing.T) {
	e := newTinyEngine(t)
	r := generate(t, e, Request{Prompt: "Once upon", MaxTokens: 8, IgnoreEOS: true, Logprobs: true, TopLogprobs: 20})
	for _, ev := range r.events {
		top := ev.TopLogprobs
		if len(top) != 20 || top[0].ID != ev.TokenID || top[0].Logprob != ev.Logprob || ev.Logprob >= 0 {
			t.Fatalf("event %+v", ev)
		}
		for i := 1; i < len(top); i++ {
			if top[i].Logprob > top[i-1].Logprob || top[i].Logprob == top[i-1].Logprob && top[i].ID < top[i-1].ID {
				t.Fatalf("top logprobs out of order: %+v", top)
			}
		}
	}
	plain := generate(t, e, Request{Prompt: "Once upon", MaxTokens: 8, IgnoreEOS: true, Logprobs: true})
	none := generate(t, e, Request{Prompt: "Once upon", MaxTokens: 8, IgnoreEOS: true})
	for i, ev := range none.events {
		if ev.Logprob != 0 || ev.TopLogprobs != nil || plain.events[i].TopLogprobs != nil || plain.events[i].Logprob != r.events[i].Logprob {
			t.Fatalf("event %d: unasked logprobs %+v, logprobs only %+v", i, ev, plain.events[i])
		}
	}
}

// pieceID is the token whose whole piece is p.
func pieceID(t *testing.T, e *Engine, p string) int {
	t.Helper()
	for id := range e.Tokenizer.VocabSize() {
		if string(e.Tokenizer.Piece(e.Tokenizer.EOS(), id)) == p {
			return id
		}
	}
	t.Fatalf("no token %q", p)
	return 0
}

// TestOptionalStructured: an optional grammar binds when the first token
// starts with '{' (forced with logit_bias) and then validates; a run
// whose first token is free text is exactly the unconstrained run; a
// budget too small for the value leaves only free text.
func TestOptionalStructured(t *testing.T) {
	e := newTinyEngine(t)
	a := compileSchema(t, testSchema)
	var raw map[string]any
	json.Unmarshal([]byte(testSchema), &raw)
	brace, word := pieceID(t, e, "{"), pieceID(t, e, "water")
	opt := &Structured{Automaton: a, Optional: true}
	for seed := range uint64(3) {
		bound := generate(t, e, Request{Prompt: "Call a tool", MaxTokens: a.MinClose(a.Start()) + 20, Structured: opt,
			Sampling: sample.Params{Temperature: 1, Seed: seed, LogitBias: map[int]float64{brace: 100}}})
		out := textOf(bound)
		if !strings.HasPrefix(out, "{") || bound.finish.FinishReason != sched.FinishStop {
			t.Fatalf("seed %d: bound run %q, finish %s", seed, out, bound.finish.FinishReason)
		}
		if _, err := decodeJSON([]byte(out)); err != nil {
			t.Fatalf("seed %d: %q does not parse: %v", seed, out, err)
		}

		free := Request{Prompt: "Call a tool", MaxTokens: 24, IgnoreEOS: true,
			Sampling: sample.Params{Temperature: 1, Seed: seed, LogitBias: map[int]float64{word: 100}}}
		plain := generate(t, e, free)
		free.Structured = opt
		got := generate(t, e, free)
		if got.events[0].TokenID != word || !slices.EqualFunc(got.events, plain.events, func(x, y Event) bool { return x.TokenID == y.TokenID }) {
			t.Fatalf("seed %d: free run %q differs from the unconstrained %q", seed, textOf(got), textOf(plain))
		}

		tiny := generate(t, e, Request{Prompt: "Call a tool", MaxTokens: 3, Structured: opt, IgnoreEOS: true,
			Sampling: sample.Params{Temperature: 1, Seed: seed, LogitBias: map[int]float64{brace: 100}}})
		if strings.HasPrefix(textOf(tiny), "{") {
			t.Fatalf("seed %d: a value that cannot close in 3 tokens began: %q", seed, textOf(tiny))
		}
	}
}

// TestStructuredRefusals: bad structured requests are typed errors naming
// the field, before anything runs.
func TestStructuredRefusals(t *testing.T) {
	e := newTinyEngine(t)
	a := compileSchema(t, testSchema)
	s := &Structured{Automaton: a}
	prefix := []int{pieceID(t, e, "{"), pieceID(t, e, "\""), pieceID(t, e, "a")}
	after, ok := a.Advance(a.Start(), []byte(`{"a`))
	if !ok {
		t.Fatal(`{"a refused`)
	}
	for name, c := range map[string]struct {
		r      Request
		field  string
		budget bool
	}{
		"max tokens below the shortest value": {Request{Prompt: "hi", MaxTokens: a.MinClose(a.Start()) - 1, Structured: s}, "max_tokens", true},
		"top_logprobs 21":                     {Request{Prompt: "hi", MaxTokens: 5, Logprobs: true, TopLogprobs: 21}, "top_logprobs", false},
		"top_logprobs -1":                     {Request{Prompt: "hi", MaxTokens: 5, Logprobs: true, TopLogprobs: -1}, "top_logprobs", false},
		"top_logprobs without logprobs":       {Request{Prompt: "hi", MaxTokens: 5, TopLogprobs: 2}, "top_logprobs", false},
		"no automaton":                        {Request{Prompt: "hi", MaxTokens: 50, Structured: &Structured{}}, "response_format", false},
		"prefix off the grammar":              {Request{Prompt: "hi", MaxTokens: 50, Structured: s, PrefixTokens: []int{pieceID(t, e, "water")}}, "response_format", false},
		"prefix too long to close": {Request{Prompt: "hi", MaxTokens: len(prefix) + a.MinClose(after) - 1, Structured: s,
			PrefixTokens: prefix}, "max_tokens", true},
	} {
		_, err := e.Generate(context.Background(), c.r)
		var re *RequestError
		if !errors.As(err, &re) || !errors.Is(err, ErrInvalidRequest) || re.Field != c.field {
			t.Errorf("%s: %v, want a RequestError on %q", name, err, c.field)
		}
		if c.budget && !strings.Contains(err.Error(), "shortest") {
			t.Errorf("%s: %v does not say why", name, err)
		}
	}
	if st := e.Stats(); st.Running+st.Queued != 0 || st.FreeBlocks != st.TotalBlocks {
		t.Fatalf("refusals left work behind: %+v", st)
	}
}
