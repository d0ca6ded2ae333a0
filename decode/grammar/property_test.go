package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// builtinVocab is the engine's built-in vocabulary as the sampler sees it.
func builtinVocab() (*Vocab, [][]byte) {
	tok := tokenizer.NewBuiltin()
	pieces := make([][]byte, tok.VocabSize())
	for id := range pieces {
		pieces[id] = tok.Piece(tok.EOS(), id)
	}
	return NewVocab(pieces, tok.EOS()), pieces
}

var propNames = []string{"a", "ab", "name", "x y", "é", "id", "tags", "n"}

// randomSchema returns a random schema of the subset, as decoded JSON.
func randomSchema(r *rand.Rand, depth int) map[string]any {
	leaf := depth >= 4
	switch k := r.IntN(13); {
	case k == 0:
		return map[string]any{"type": "string"}
	case k == 1:
		return map[string]any{"type": "string", "enum": []any{"red", "green", "g", "blue \"b\""}[:1+r.IntN(4)]}
	case k == 2:
		return map[string]any{"type": "number"}
	case k == 3:
		return map[string]any{"type": "integer"}
	case k == 4:
		return map[string]any{"type": "boolean"}
	case k == 5:
		return map[string]any{"type": "null"}
	case k == 6:
		return map[string]any{"enum": []any{json.Number("1"), json.Number("12"), "x", nil, true, json.Number("-2.5")}[r.IntN(3):]}
	case k == 7:
		return map[string]any{}
	case k == 8:
		return map[string]any{"type": []any{"string", "null"}}
	case k <= 10 && !leaf:
		return randomObject(r, depth)
	case !leaf:
		s := map[string]any{"type": "array", "items": randomSchema(r, depth+1)}
		lo := r.IntN(3)
		if r.IntN(2) == 0 {
			s["minItems"] = json.Number(fmt.Sprint(lo))
		}
		if r.IntN(2) == 0 {
			s["maxItems"] = json.Number(fmt.Sprint(lo + r.IntN(3)))
		}
		return s
	}
	return map[string]any{"type": "integer"}
}

func randomObject(r *rand.Rand, depth int) map[string]any {
	props := map[string]any{}
	var req []any
	for _, name := range propNames {
		if r.IntN(3) == 0 {
			props[name] = randomSchema(r, depth+1)
			if r.IntN(2) == 0 {
				req = append(req, name)
			}
		}
	}
	s := map[string]any{"type": "object", "properties": props}
	if len(req) > 0 {
		s["required"] = req
	}
	switch r.IntN(4) {
	case 0:
		s["additionalProperties"] = true
	case 1:
		s["additionalProperties"] = map[string]any{"type": "integer"}
	}
	lo := 0
	if r.IntN(3) == 0 {
		lo = r.IntN(len(props) + 1) // only declared properties count towards it
		s["minProperties"] = json.Number(fmt.Sprint(lo))
	}
	if r.IntN(3) == 0 {
		s["maxProperties"] = json.Number(fmt.Sprint(max(lo, len(req)) + r.IntN(3)))
	}
	return s
}

// randomToolCalls is the schema a frontend compiles for tools: exactly
// one property, named after a function, holding its arguments; in an
// array of them for parallel calls.
func randomToolCalls(r *rand.Rand) map[string]any {
	fns := map[string]any{}
	for _, name := range propNames[:1+r.IntN(len(propNames))] {
		args := randomObject(r, 2)
		args["additionalProperties"] = false
		fns[name] = args
	}
	s := map[string]any{"type": "object", "properties": fns, "minProperties": json.Number("1"), "maxProperties": json.Number("1")}
	if r.IntN(2) == 0 {
		return map[string]any{"type": "array", "items": s, "minItems": json.Number("1")}
	}
	return s
}

// validate checks v (decoded with UseNumber) against schema s: an
// independent reading of the subset, for the property test.
func validate(s map[string]any, v any) error {
	if e, ok := s["enum"].([]any); ok {
		for _, want := range e {
			if equalJSON(want, v) {
				return nil
			}
		}
		return fmt.Errorf("%v not in enum %v", v, e)
	}
	var types []string
	switch t := s["type"].(type) {
	case string:
		types = []string{t}
	case []any:
		for _, e := range t {
			types = append(types, e.(string))
		}
	}
	if len(types) == 0 {
		return nil
	}
	for _, t := range types {
		if err := validateType(s, t, v); err == nil {
			return nil
		} else if len(types) == 1 {
			return err
		}
	}
	return fmt.Errorf("%v matches none of %v", v, types)
}

func validateType(s map[string]any, t string, v any) error {
	switch t {
	case "object":
		return validateObject(s, v)
	case "array":
		l, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%v is not an array", v)
		}
		if n, ok := s["minItems"].(json.Number); ok && len(l) < atoi(n) {
			return fmt.Errorf("%d items, want at least %s", len(l), n)
		}
		if n, ok := s["maxItems"].(json.Number); ok && len(l) > atoi(n) {
			return fmt.Errorf("%d items, want at most %s", len(l), n)
		}
		for _, e := range l {
			if err := validate(s["items"].(map[string]any), e); err != nil {
				return err
			}
		}
		return nil
	case "string":
		if _, ok := v.(string); !ok {
			return fmt.Errorf("%v is not a string", v)
		}
	case "number", "integer":
		n, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%v is not a number", v)
		}
		if _, err := n.Float64(); err != nil {
			return err
		}
		if _, err := n.Int64(); t == "integer" && err != nil {
			return fmt.Errorf("%v is not an integer", v)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%v is not a boolean", v)
		}
	case "null":
		if v != nil {
			return fmt.Errorf("%v is not null", v)
		}
	}
	return nil
}

func validateObject(s map[string]any, v any) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("%v is not an object", v)
	}
	props, _ := s["properties"].(map[string]any)
	req, _ := s["required"].([]any)
	if n, ok := s["minProperties"].(json.Number); ok && len(m) < atoi(n) {
		return fmt.Errorf("%d properties, want at least %s", len(m), n)
	}
	if n, ok := s["maxProperties"].(json.Number); ok && len(m) > atoi(n) {
		return fmt.Errorf("%d properties, want at most %s", len(m), n)
	}
	for _, name := range req {
		if _, ok := m[name.(string)]; !ok {
			return fmt.Errorf("required %q missing", name)
		}
	}
	for k, e := range m {
		sub, ok := props[k].(map[string]any)
		if !ok {
			switch a := s["additionalProperties"].(type) {
			case bool:
				if !a {
					return fmt.Errorf("additional property %q", k)
				}
				continue
			case map[string]any:
				sub = a
			default:
				return fmt.Errorf("additional property %q", k)
			}
		}
		if err := validate(sub, e); err != nil {
			return fmt.Errorf("%q: %w", k, err)
		}
	}
	return nil
}

func atoi(n json.Number) int {
	i, _ := n.Int64()
	return int(i)
}

func equalJSON(a, b any) bool {
	na, oka := a.(json.Number)
	nb, okb := b.(json.Number)
	if oka && okb {
		fa, _ := na.Float64()
		fb, _ := nb.Float64()
		return fa == fb
	}
	return a == b
}

func decodeNumbers(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("trailing data")
	}
	return v, nil
}

// sampleOnce draws tokens by random logits among those MaskBudget allows,
// and returns them with the state after each prefix.
func sampleOnce(t *testing.T, r *rand.Rand, a *Automaton, v *Vocab, pieces [][]byte, budget int) ([]int, []State) {
	allowed := make([]bool, v.Size())
	s := a.Start()
	states := []State{s}
	var ids []int
	eosBoost := r.Float64() * 12
	for len(ids) < budget {
		a.MaskBudget(s, v, allowed, budget-len(ids))
		best, bestLogit := -1, 0.0
		for id, ok := range allowed {
			if !ok {
				continue
			}
			l := r.NormFloat64()
			if id == v.eos {
				l += eosBoost
			}
			if best < 0 || l > bestLogit {
				best, bestLogit = id, l
			}
		}
		if best < 0 {
			t.Fatalf("no token allowed after %q", joinPieces(pieces, ids))
		}
		if best == v.eos {
			break
		}
		var ok bool
		if s, ok = a.Advance(s, pieces[best]); !ok {
			t.Fatalf("Mask allowed %q after %q, Advance refuses it", pieces[best], joinPieces(pieces, ids))
		}
		ids = append(ids, best)
		states = append(states, s)
	}
	return ids, states
}

func joinPieces(pieces [][]byte, ids []int) []byte {
	var out []byte
	for _, id := range ids {
		out = append(out, pieces[id]...)
	}
	return out
}

// TestMaskedSamplingYieldsValidJSON is the automaton's property: for
// random schemas and random logits over the built-in vocabulary, masked
// sampling under a token budget always yields JSON that parses and
// validates, and replaying any prefix gives the state reached
// incrementally.
func TestMaskedSamplingYieldsValidJSON(t *testing.T) {
	v, pieces := builtinVocab()
	cases := 3000
	if testing.Short() {
		cases = 400
	}
	r := rand.New(rand.NewPCG(12, 2026))
	for i := range cases {
		raw := randomSchema(r, 1)
		switch {
		case i%5 == 0:
			raw = randomObject(r, 1) // structured output is mostly objects
		case i%5 == 1 && i%3 == 0:
			raw = randomToolCalls(r)
		}
		schema, _ := json.Marshal(raw)
		a, err := Compile(schema)
		if err != nil {
			t.Fatalf("case %d: Compile(%s): %v", i, schema, err)
		}
		if i%7 == 0 {
			a, raw = JSONObject(), map[string]any{"type": "object", "additionalProperties": true}
		}
		budget := a.MinClose(a.Start()) + r.IntN(40)
		ids, states := sampleOnce(t, r, a, v, pieces, budget)
		out := joinPieces(pieces, ids)
		if !a.Accepting(states[len(states)-1]) {
			t.Fatalf("case %d: schema %s: output %q (%d tokens, budget %d) is not complete", i, schema, out, len(ids), budget)
		}
		val, err := decodeNumbers(out)
		if err != nil {
			t.Fatalf("case %d: schema %s: output %q does not parse: %v", i, schema, out, err)
		}
		if err := validate(raw, val); err != nil {
			t.Fatalf("case %d: schema %s: output %q does not validate: %v", i, schema, out, err)
		}
		k := r.IntN(len(ids) + 1)
		tokens := make([][]byte, k)
		for j := range k {
			tokens[j] = pieces[ids[j]]
		}
		if got, err := a.Replay(tokens); err != nil || got != states[k] {
			t.Fatalf("case %d: replay of %d tokens of %q: %v, state differs: %v", i, k, out, err, got != states[k])
		}
	}
}

// TestMinCloseIsExact checks, along sampled outputs, that MinClose is 0
// exactly when accepting and that some byte lowers it by exactly one: the
// property forced closure relies on.
func TestMinCloseIsExact(t *testing.T) {
	v, pieces := builtinVocab()
	r := rand.New(rand.NewPCG(7, 7))
	cases := 300
	if testing.Short() {
		cases = 60
	}
	for range cases {
		raw := randomSchema(r, 1)
		schema, _ := json.Marshal(raw)
		a, err := Compile(schema)
		if err != nil {
			t.Fatal(err)
		}
		_, states := sampleOnce(t, r, a, v, pieces, 30+r.IntN(30))
		for _, s := range states {
			mc := a.MinClose(s)
			if (mc == 0) != a.Accepting(s) {
				t.Fatalf("schema %s: MinClose %d, Accepting %v", schema, mc, a.Accepting(s))
			}
			if mc == 0 {
				continue
			}
			if !slices.ContainsFunc(allBytes, func(b byte) bool {
				t2, ok := a.Advance(s, []byte{b})
				return ok && a.MinClose(t2) == mc-1
			}) {
				t.Fatalf("schema %s: no byte lowers MinClose %d", schema, mc)
			}
		}
	}
}

var allBytes = func() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

// TestMaskAgreesWithAdvance: Mask allows exactly the tokens Advance takes.
func TestMaskAgreesWithAdvance(t *testing.T) {
	v, pieces := builtinVocab()
	r := rand.New(rand.NewPCG(3, 4))
	allowed := make([]bool, v.Size())
	for range 40 {
		schema, _ := json.Marshal(randomObject(r, 1))
		a, err := Compile(schema)
		if err != nil {
			t.Fatal(err)
		}
		_, states := sampleOnce(t, r, a, v, pieces, 40)
		for _, s := range states {
			a.Mask(s, v, allowed)
			for id, p := range pieces {
				_, ok := a.Advance(s, p)
				want := ok && len(p) > 0 || id == v.eos && a.Accepting(s)
				if allowed[id] != want {
					t.Fatalf("schema %s: token %d %q: Mask %v, Advance %v", schema, id, p, allowed[id], want)
				}
			}
		}
	}
}
