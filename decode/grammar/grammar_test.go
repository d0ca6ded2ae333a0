package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestCompile(t *testing.T) {
	deep := strings.Repeat(`{"type":"array","items":`, MaxDepth-1) + `{"type":"null"}` + strings.Repeat(`}`, MaxDepth-1)
	var many []string
	for i := range MaxNodes {
		many = append(many, fmt.Sprintf(`"p%d":{"type":"array","items":{"type":"null"}}`, i%60))
	}
	wide := `{"type":"object","properties":{` + strings.Join(many[:60], ",") + `}}`
	nested := `{"type":"object","properties":{"x":` + wide + `,"y":` + wide + `,"z":` + wide + `}}`
	tests := []struct {
		schema  string
		err     error
		keyword string
	}{
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`, nil, ""},
		{`{"type":"object","additionalProperties":true}`, nil, ""},
		{`{"type":"object","additionalProperties":{"type":"number"}}`, nil, ""},
		{`{"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3}`, nil, ""},
		{`{"type":"string","enum":["a","b"]}`, nil, ""},
		{`{"enum":[1,"x",null,true]}`, nil, ""},
		{`{"const":"x"}`, nil, ""},
		{`{"type":["string","null"]}`, nil, ""},
		{`{"title":"t","description":"d","type":"boolean"}`, nil, ""},
		{`{}`, nil, ""},
		{`{"properties":{"a":{}}}`, nil, ""}, // object inferred
		{deep, nil, ""},
		{`{"type":"string","pattern":"^a"}`, ErrUnsupported, "pattern"},
		{`{"type":"string","format":"date"}`, ErrUnsupported, "format"},
		{`{"anyOf":[{"type":"string"}]}`, ErrUnsupported, "anyOf"},
		{`{"$ref":"#/x"}`, ErrUnsupported, "$ref"},
		{`{"type":"number","minimum":0}`, ErrUnsupported, "minimum"},
		{`{"type":"object","properties":{"a":{"type":"string","minLength":2}}}`, ErrUnsupported, "minLength"},
		{`{"enum":[[1]]}`, ErrUnsupported, "enum"},
		{`{"enum":[1e999]}`, ErrUnsupported, "enum"},
		{`{"type":["number","integer"]}`, ErrUnsupported, "type"},
		{`{"type":"object","properties":{"a\"b":{}}}`, ErrUnsupported, "properties"},
		{`{"type":"strin"}`, ErrInvalidSchema, "type"},
		{`{"type":"object","required":["a"]}`, ErrInvalidSchema, "required"},
		{`{"type":"string","items":{}}`, ErrInvalidSchema, "items"},
		{`{"type":"array","minItems":3,"maxItems":2}`, ErrInvalidSchema, "maxItems"},
		{`{"type":"array","minItems":-1}`, ErrInvalidSchema, "minItems"},
		{`{"enum":[]}`, ErrInvalidSchema, "enum"},
		{`{"enum":["a"],"type":"integer"}`, ErrInvalidSchema, "enum"},
		{`{"type":"object","additionalProperties":3}`, ErrInvalidSchema, "additionalProperties"},
		{`[]`, ErrInvalidSchema, ""},
		{`{"type":"string"} x`, ErrInvalidSchema, ""},
		{`not json`, ErrInvalidSchema, ""},
		{`{"type":"array","items":` + deep + `}`, ErrTooLarge, ""},
		{`{"type":"array","minItems":5000}`, ErrTooLarge, "minItems"},
		{nested, ErrTooLarge, ""},
	}
	for _, tt := range tests {
		name := tt.schema
		if len(name) > 60 {
			name = name[:60]
		}
		t.Run(name, func(t *testing.T) {
			a, err := Compile([]byte(tt.schema))
			if tt.err == nil {
				if err != nil || a == nil {
					t.Fatalf("Compile: %v", err)
				}
				return
			}
			var se *SchemaError
			if !errors.Is(err, tt.err) || !errors.As(err, &se) || se.Keyword != tt.keyword {
				t.Fatalf("Compile: %v (%#v), want %v on keyword %q", err, se, tt.err, tt.keyword)
			}
		})
	}
}

const personSchema = `{"type":"object","properties":{
	"name":{"type":"string"},
	"age":{"type":"integer"},
	"score":{"type":"number"},
	"ok":{"type":"boolean"},
	"tags":{"type":"array","items":{"enum":["a","b",1]},"maxItems":2},
	"nick":{"type":["string","null"]}},
	"required":["name","age"]}`

func TestAdvance(t *testing.T) {
	person := mustCompile(t, personSchema)
	tests := []struct {
		a          *Automaton
		in         string
		ok, accept bool
	}{
		{person, `{"name":"x","age":3}`, true, true},
		{person, `{"age": 30, "name": "é\u00e9\n", "tags":["a", 1]}`, true, true},
		{person, `{"name":"x","age":-0,"score":-1.5e+10,"ok":false,"nick":null}`, true, true},
		{person, `{"name":"x","age":3`, true, false},
		{person, `{"name":"x"`, true, false},
		{person, `{"name":"x"}`, false, false},                // age required
		{person, `{"name":"x","age":3,"zz":1}`, false, false}, // no additional
		{person, `{"name":"x","name":"y"}`, false, false},     // twice
		{person, `{ "name":"x","age":3}`, false, false},       // space only after ':' and ','
		{person, `{"name":  "x"}`, false, false},              // one space at most
		{person, `{"name":"x","age":3.5}`, false, false},      // integer
		{person, `{"name":"x","age":012}`, false, false},      // leading zero
		{person, `{"name":"x","age":1234567890123456}`, false, false},
		{person, `{"name":"x","age":1,"tags":["a","b","a"]}`, false, false}, // maxItems
		{person, `{"name":"x","age":1,"tags":["c"]}`, false, false},
		{person, `{"name":"a\x01"}`, false, false},            // control character
		{person, "{\"name\":\"\xff\"}", false, false},         // invalid UTF-8
		{person, "{\"name\":\"\xed\xa0\x80\"}", false, false}, // surrogate
		{person, `{"name":"\q"}`, false, false},
		{person, `{"name":"x","age":3} `, false, false}, // nothing after the value
		{JSONObject(), `{}`, true, true},
		{JSONObject(), `{"a":[1,2.5e3,{"b":null}], "c": true, "d":"\u00e9"}`, true, true},
		{JSONObject(), `[]`, false, false},
		{JSONObject(), `{"a":1e999}`, false, false}, // exponent: 2 digits
		{JSONObject(), strings.Repeat(`{"a":`, MaxDepth+1), false, false},
		{mustCompile(t, `{"enum":[1,12,"x"]}`), `1`, true, true},
		{mustCompile(t, `{"enum":[1,12,"x"]}`), `12`, true, true},
		{mustCompile(t, `{"enum":[1,12,"x"]}`), `13`, false, false},
		{mustCompile(t, `{"type":"number"}`), `-`, true, false},
		{mustCompile(t, `{"type":"number"}`), `0.5E-12`, true, true},
		{mustCompile(t, `{"type":"array","minItems":2,"items":{"type":"null"}}`), `[null]`, false, false},
		{mustCompile(t, `{"type":"array","minItems":2,"items":{"type":"null"}}`), `[null, null]`, true, true},
	}
	for _, tt := range tests {
		s, ok := tt.a.Advance(tt.a.Start(), []byte(tt.in))
		if ok != tt.ok || tt.a.Accepting(s) != tt.accept {
			t.Errorf("%q: Advance %v Accepting %v, want %v %v", tt.in, ok, tt.a.Accepting(s), tt.ok, tt.accept)
		}
		if tt.accept && !json.Valid([]byte(tt.in)) {
			t.Errorf("%q accepted, not JSON", tt.in)
		}
		// Byte by byte is the same as all at once.
		b := tt.a.Start()
		for i := 0; i < len(tt.in) && ok; i++ {
			b, _ = tt.a.Advance(b, []byte{tt.in[i]})
		}
		if ok && b != s {
			t.Errorf("%q: byte by byte reaches another state", tt.in)
		}
	}
}

func TestMinClose(t *testing.T) {
	person := mustCompile(t, personSchema)
	for _, tt := range []struct{ in, closing string }{
		{``, `{"age":0,"name":""}`},
		{`{"name":"x`, `","age":0}`},
		{`{"na`, `me":"","age":0}`},
		{`{"age":1,"tags":[`, `],"name":""}`},
		{`{"age":1,"name":"\u00`, `00"}`},
		{`{"age":1.`, ``}, // refused: integer
	} {
		s, ok := person.Advance(person.Start(), []byte(tt.in))
		if !ok {
			continue
		}
		if got := person.MinClose(s); got != len(tt.closing) {
			t.Errorf("MinClose after %q = %d, want %d (%s)", tt.in, got, len(tt.closing), tt.closing)
		}
		if c, ok := person.Advance(s, []byte(tt.closing)); !ok || !person.Accepting(c) {
			t.Errorf("%q + %q does not close", tt.in, tt.closing)
		}
	}
}

func TestReplayRefuses(t *testing.T) {
	a := mustCompile(t, personSchema)
	_, err := a.Replay([][]byte{[]byte(`{"na`), []byte(`x`)})
	if !errors.Is(err, ErrRejected) {
		t.Fatalf("Replay: %v, want ErrRejected", err)
	}
}

func mustCompile(t testing.TB, schema string) *Automaton {
	t.Helper()
	a, err := Compile([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// FuzzCompile: any input compiles or is refused with a *SchemaError, in
// bounded time, and a compiled schema's shortest value is accepted.
func FuzzCompile(f *testing.F) {
	f.Add([]byte(personSchema))
	f.Add([]byte(`{"type":["string","null"],"enum":["a",null]}`))
	f.Add([]byte(`{"type":"array","items":{"type":"object","additionalProperties":true},"minItems":2}`))
	f.Fuzz(func(t *testing.T, schema []byte) {
		start := time.Now()
		a, err := Compile(schema)
		if d := time.Since(start); d > time.Second {
			t.Fatalf("Compile took %v", d)
		}
		if err != nil {
			var se *SchemaError
			if !errors.As(err, &se) {
				t.Fatalf("Compile: %v is not a *SchemaError", err)
			}
			return
		}
		if mc := a.MinClose(a.Start()); mc <= 0 || mc > 1<<20 {
			t.Fatalf("MinClose(Start) = %d", mc)
		}
	})
}

// FuzzAdvance: whatever bytes come, Advance never panics, an accepted
// whole parses as JSON, and feeding them at once or byte by byte agrees.
func FuzzAdvance(f *testing.F) {
	f.Add(0, []byte(`{"name":"x","age":3}`))
	f.Add(1, []byte(`{"a":[1,2.5e3,{"b":null}], "c": true}`))
	f.Add(0, []byte("{\"name\":\"\xe2\x82"))
	person := mustCompile(f, personSchema)
	automata := []*Automaton{person, JSONObject()}
	f.Fuzz(func(t *testing.T, which int, in []byte) {
		a := automata[uint(which)%uint(len(automata))]
		s := a.Start()
		n := 0
		for _, c := range in {
			next, ok := a.Advance(s, []byte{c})
			if !ok {
				break
			}
			s, n = next, n+1
		}
		whole, ok := a.Advance(a.Start(), in[:n])
		if !ok || whole != s {
			t.Fatalf("%q: at once %v, byte by byte differs", in[:n], ok)
		}
		if a.Accepting(s) && !json.Valid(in[:n]) {
			t.Fatalf("%q accepted, not JSON", in[:n])
		}
		if mc := a.MinClose(s); (mc == 0) != a.Accepting(s) {
			t.Fatalf("%q: MinClose %d, Accepting %v", in[:n], mc, a.Accepting(s))
		}
	})
}

// BenchmarkMask measures one Mask call over the built-in vocabulary, in a
// free string (the whole vocabulary trie is walked) and between values.
func BenchmarkMask(b *testing.B) {
	v, _ := builtinVocab()
	a := mustCompile(b, personSchema)
	allowed := make([]bool, v.Size())
	for _, at := range []string{`{"name":"`, `{"name":"x",`, `{"name":"x","age":12`, ``} {
		s, ok := a.Advance(a.Start(), []byte(at))
		if !ok {
			b.Fatal(at)
		}
		b.Run(fmt.Sprintf("after=%q", at), func(b *testing.B) {
			for b.Loop() {
				a.Mask(s, v, allowed)
			}
		})
		b.Run(fmt.Sprintf("budget/after=%q", at), func(b *testing.B) {
			for b.Loop() {
				a.MaskBudget(s, v, allowed, a.MinClose(s)+3)
			}
		})
	}
}
