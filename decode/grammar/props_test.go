package grammar

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

const toolsSchema = `{"type":"object","properties":{
	"get_weather":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},
	"now":{"type":"object"}},
	"minProperties":1,"maxProperties":1}`

func TestPropertyCountsCompile(t *testing.T) {
	tests := []struct {
		schema  string
		err     error
		keyword string
	}{
		{toolsSchema, nil, ""},
		{`{"type":"array","items":` + toolsSchema + `}`, nil, ""},
		{`{"minProperties":1,"properties":{"a":{}}}`, nil, ""}, // object inferred
		{`{"type":"object","maxProperties":0}`, nil, ""},
		{`{"type":"object","additionalProperties":true,"maxProperties":3}`, nil, ""},
		{`{"type":"object","properties":{"a":{}},"minProperties":2}`, ErrInvalidSchema, "minProperties"},
		{`{"type":"object","additionalProperties":true,"minProperties":1}`, ErrUnsupported, "minProperties"},
		{`{"type":"object","properties":{"a":{},"b":{}},"minProperties":2,"maxProperties":1}`, ErrInvalidSchema, "maxProperties"},
		{`{"type":"object","properties":{"a":{},"b":{}},"required":["a","b"],"maxProperties":1}`, ErrInvalidSchema, "maxProperties"},
		{`{"type":"object","minProperties":-1}`, ErrInvalidSchema, "minProperties"},
		{`{"type":"object","maxProperties":1.5}`, ErrInvalidSchema, "maxProperties"},
		{`{"type":"object","minProperties":65}`, ErrTooLarge, "minProperties"},
		{`{"type":"string","maxProperties":1}`, ErrInvalidSchema, "maxProperties"},
		{`{"enum":["a"],"minProperties":1}`, ErrInvalidSchema, "minProperties"},
	}
	for _, tt := range tests {
		a, err := Compile([]byte(tt.schema))
		if tt.err == nil {
			if err != nil || a == nil {
				t.Errorf("Compile(%s): %v", tt.schema, err)
			}
			continue
		}
		var se *SchemaError
		if !errors.Is(err, tt.err) || !errors.As(err, &se) || se.Keyword != tt.keyword {
			t.Errorf("Compile(%s): %v, want %v on keyword %q", tt.schema, err, tt.err, tt.keyword)
		}
	}
}

func TestPropertyCountsAdvance(t *testing.T) {
	tools := mustCompile(t, toolsSchema)
	calls := mustCompile(t, `{"type":"array","items":`+toolsSchema+`,"minItems":1}`)
	opt := mustCompile(t, `{"type":"object","properties":{"a":{"type":"null"},"bb":{"type":"null"},"c":{"type":"null"}},"required":["c"],"minProperties":2,"maxProperties":2}`)
	addl := mustCompile(t, `{"type":"object","properties":{"a":{"type":"null"}},"required":["a"],"additionalProperties":{"type":"null"},"maxProperties":2}`)
	tests := []struct {
		a          *Automaton
		in         string
		ok, accept bool
	}{
		{tools, `{"now":{}}`, true, true},
		{tools, `{"get_weather":{"city":"Paris"}}`, true, true},
		{tools, `{}`, false, false},         // minProperties 1
		{tools, `{"now":{},`, false, false}, // maxProperties 1
		{tools, `{"now":{}, "get_weather":{}}`, false, false},
		{calls, `[{"now":{}}, {"get_weather":{"city":""}}]`, true, true},
		{calls, `[{"now":{}}, {}]`, false, false},
		{opt, `{"c":null}`, false, false}, // minProperties 2
		{opt, `{"c":null,"a":null}`, true, true},
		{opt, `{"a":null,"bb":null}`, false, false}, // no room left for c
		{opt, `{"a":null,"b`, false, false},         // refused at the byte
		{opt, `{"a":null,"c":null,`, false, false},  // maxProperties 2
		{addl, `{"x":null,"a":null}`, true, true},
		{addl, `{"x":null,"y`, false, false},        // only "a" keeps room for "a"
		{addl, `{"x":null,"y":null}`, false, false}, // no room left for a
		{addl, `{"a":null,"x":null}`, true, true},
		{addl, `{"a":null,"x":null,`, false, false},
	}
	for _, tt := range tests {
		s, ok := tt.a.Advance(tt.a.Start(), []byte(tt.in))
		if ok != tt.ok || tt.a.Accepting(s) != tt.accept {
			t.Errorf("%q: Advance %v Accepting %v, want %v %v", tt.in, ok, tt.a.Accepting(s), tt.ok, tt.accept)
		}
	}
	// The shortest values, with the property counts in MinClose.
	for _, tt := range []struct {
		a       *Automaton
		in      string
		closing string
	}{
		{tools, ``, `{"now":{}}`},
		{tools, `{"get_`, `weather":{"city":""}}`},
		{opt, ``, `{"a":null,"c":null}`},
		{opt, `{"c":null`, `,"a":null}`},
		{opt, `{"bb":null`, `,"c":null}`},
		{addl, `{"x":null`, `,"a":null}`},
	} {
		s, ok := tt.a.Advance(tt.a.Start(), []byte(tt.in))
		if !ok {
			t.Fatalf("%q refused", tt.in)
		}
		if got := tt.a.MinClose(s); got != len(tt.closing) {
			t.Errorf("MinClose after %q = %d, want %d (%s)", tt.in, got, len(tt.closing), tt.closing)
		}
		if c, ok := tt.a.Advance(s, []byte(tt.closing)); !ok || !tt.a.Accepting(c) {
			t.Errorf("%q + %q does not close", tt.in, tt.closing)
		}
	}
}

// TestClosedMeansNoByteMore: Closed is exactly "accepting, and no byte
// extends the value", along sampled outputs of random schemas.
func TestClosedMeansNoByteMore(t *testing.T) {
	v, pieces := builtinVocab()
	r := rand.New(rand.NewPCG(5, 12))
	for range 60 {
		schema, _ := json.Marshal(randomSchema(r, 1))
		a, err := Compile(schema)
		if err != nil {
			t.Fatal(err)
		}
		_, states := sampleOnce(t, r, a, v, pieces, 30+r.IntN(30))
		for _, s := range states {
			extends := slices.ContainsFunc(allBytes, func(b byte) bool {
				_, ok := a.Advance(s, []byte{b})
				return ok
			})
			if want := a.Accepting(s) && !extends; a.Closed(s) != want {
				t.Fatalf("schema %s: Closed %v, want %v", schema, a.Closed(s), want)
			}
		}
	}
}
