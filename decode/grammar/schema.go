package grammar

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Bounds on a schema and on what the automaton produces.
const (
	MaxDepth      = 16  // nesting of schema nodes (the root is depth 1)
	MaxNodes      = 256 // compiled nodes, union alternatives included
	MaxProperties = 64  // declared properties of one object
	MaxMinItems   = 1024
	// MaxEnumValues bounds the values of one enum; MaxLiteralBytes the
	// bytes of every literal text and property name of a schema together.
	// Both bound compile time and the automaton's memory, which a worker
	// keeps in its schema cache.
	MaxEnumValues   = 1024
	MaxLiteralBytes = 64 << 10
	// maxTrieNodes bounds a literal or key trie: its positions are uint16
	// with offTrie (0xFFFF) reserved.
	maxTrieNodes  = offTrie - 1
	maxIntDigits  = 15 // digits before the point: exact in a float64
	maxFracDigits = 15
	maxExpDigits  = 2 // exponents up to 99: always in float64 range
	unbounded     = math.MaxUint16
)

type kind uint8

const (
	kObject kind = iota + 1
	kArray
	kString
	kNumber
	kInteger
	kLiteral // a fixed set of JSON texts: enum, const, boolean, null
	kUnion   // alternatives told apart by their first byte
)

// node is one compiled schema node.
type node struct {
	kind kind
	// object
	names    []string // declared properties; index = bit in seen
	propNode []uint16
	keys     *trie // the names, terminal = property index
	required uint64
	addl     int32 // node of additional properties' values; -1: refused
	// minProps and maxProps bound the properties (unbounded: no maximum);
	// optByCost are the optional properties, cheapest first (props.go).
	minProps, maxProps int
	optByCost          []uint8
	// array
	items              uint16
	minItems, maxItems int
	// literal
	lits *trie
	// union
	alts []uint16
	// minLen is the fewest bytes of a complete value.
	minLen int
}

var (
	objectKeywords = []string{"properties", "required", "additionalProperties", "minProperties", "maxProperties"}
	arrayKeywords  = []string{"items", "minItems", "maxItems"}
	// annotations carry no constraint and are accepted as is.
	annotations = []string{"title", "description", "$schema", "$id", "$comment", "default", "examples"}
	typeNames   = []string{"object", "array", "string", "number", "integer", "boolean", "null"}
)

type compiler struct {
	nodes []node
	any   int32 // index of the any-value union, -1 until built
	// litBytes counts the literal texts' and property names' bytes.
	litBytes int
}

// spend counts n literal or name bytes against MaxLiteralBytes.
func (c *compiler) spend(n int, path, kw string) error {
	c.litBytes += n
	if c.litBytes > MaxLiteralBytes {
		return &SchemaError{Path: path, Keyword: kw, Reason: "literals and property names over " + strconv.Itoa(MaxLiteralBytes) + " bytes", Err: ErrTooLarge}
	}
	return nil
}

// trieFits refuses a trie whose positions would not fit a State.
func trieFits(t *trie, path, kw string) error {
	if len(t.nodes) > maxTrieNodes {
		return &SchemaError{Path: path, Keyword: kw, Reason: "more than " + strconv.Itoa(maxTrieNodes) + " trie nodes", Err: ErrTooLarge}
	}
	return nil
}

// Compile compiles a JSON schema of the supported subset: objects
// (properties, required, additionalProperties: false by default, true or a
// schema, minProperties and maxProperties: see props.go), arrays (items, minItems, maxItems), strings, numbers, integers,
// booleans, null, enum and const of scalar literals, type lists, and nesting
// up to MaxDepth. Anything else is a *SchemaError.
func Compile(schema []byte) (*Automaton, error) {
	d := json.NewDecoder(bytes.NewReader(schema))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, &SchemaError{Reason: "not JSON: " + err.Error(), Err: ErrInvalidSchema}
	}
	if d.More() {
		return nil, &SchemaError{Reason: "trailing data after the schema", Err: ErrInvalidSchema}
	}
	c := &compiler{any: -1}
	root, err := c.compile(v, "", 1)
	if err != nil {
		return nil, err
	}
	return newAutomaton(c.nodes, root), nil
}

var jsonObject = sync.OnceValue(func() *Automaton {
	c := &compiler{any: -1}
	id, _ := c.anyValue() // a handful of nodes: never past MaxNodes
	return newAutomaton(c.nodes, c.nodes[id].alts[0])
})

// JSONObject returns the automaton of response_format json_object: any
// JSON object (values of any type, nested at most MaxDepth deep).
func JSONObject() *Automaton { return jsonObject() }

func (c *compiler) add(n node) (uint16, error) {
	if len(c.nodes) >= MaxNodes {
		return 0, &SchemaError{Reason: "more than " + strconv.Itoa(MaxNodes) + " nodes", Err: ErrTooLarge}
	}
	c.nodes = append(c.nodes, n)
	return uint16(len(c.nodes) - 1), nil
}

func (c *compiler) compile(v any, path string, depth int) (uint16, error) {
	if depth > MaxDepth {
		return 0, &SchemaError{Path: path, Reason: "nested deeper than " + strconv.Itoa(MaxDepth), Err: ErrTooLarge}
	}
	if b, ok := v.(bool); ok && b {
		return c.anyValue()
	}
	m, ok := v.(map[string]any)
	if !ok {
		return 0, &SchemaError{Path: path, Reason: "a schema must be an object", Err: ErrInvalidSchema}
	}
	keys := slices.Sorted(mapKeys(m))
	for _, k := range keys {
		if !slices.Contains(objectKeywords, k) && !slices.Contains(arrayKeywords, k) &&
			!slices.Contains(annotations, k) && k != "type" && k != "enum" && k != "const" {
			return 0, &SchemaError{Path: path, Keyword: k, Reason: "not in the supported subset", Err: ErrUnsupported}
		}
	}
	types, err := schemaTypes(m, path)
	if err != nil {
		return 0, err
	}
	if _, ok := m["enum"]; ok {
		return c.enum(m, path, "enum", types)
	}
	if _, ok := m["const"]; ok {
		return c.enum(m, path, "const", types)
	}
	if err := checkApplies(m, path, types); err != nil {
		return 0, err
	}
	if len(types) == 0 {
		return c.anyValue()
	}
	if len(types) == 1 {
		return c.typed(m, path, depth, types[0])
	}
	var alts []uint16
	minLen := math.MaxInt
	for _, t := range types {
		id, err := c.typed(m, path, depth, t)
		if err != nil {
			return 0, err
		}
		alts = append(alts, id)
		minLen = min(minLen, c.nodes[id].minLen)
	}
	return c.add(node{kind: kUnion, alts: alts, minLen: minLen})
}

func mapKeys(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// schemaTypes returns the node's types: from "type" (a name or a list of
// distinct names), else inferred from the keywords; none means any value.
func schemaTypes(m map[string]any, path string) ([]string, error) {
	bad := func(reason string) error {
		return &SchemaError{Path: path, Keyword: "type", Reason: reason, Err: ErrInvalidSchema}
	}
	switch t := m["type"].(type) {
	case nil:
		if _, ok := m["type"]; ok {
			return nil, bad("null is not a type name")
		}
	case string:
		if !slices.Contains(typeNames, t) {
			return nil, bad("unknown type " + strconv.Quote(t))
		}
		return []string{t}, nil
	case []any:
		var out []string
		for _, e := range t {
			s, ok := e.(string)
			if !ok || !slices.Contains(typeNames, s) || slices.Contains(out, s) {
				return nil, bad("a list of distinct type names is expected")
			}
			out = append(out, s)
		}
		if len(out) == 0 {
			return nil, bad("empty type list")
		}
		if slices.Contains(out, "number") && slices.Contains(out, "integer") {
			return nil, &SchemaError{Path: path, Keyword: "type", Reason: "number together with integer", Err: ErrUnsupported}
		}
		return out, nil
	default:
		return nil, bad("a type name or a list of them is expected")
	}
	for _, k := range objectKeywords {
		if _, ok := m[k]; ok {
			return []string{"object"}, nil
		}
	}
	for _, k := range arrayKeywords {
		if _, ok := m[k]; ok {
			return []string{"array"}, nil
		}
	}
	return nil, nil
}

// checkApplies refuses object or array keywords on a node that cannot be
// an object or an array: they would be silently ignored otherwise.
func checkApplies(m map[string]any, path string, types []string) error {
	for _, g := range []struct {
		typ      string
		keywords []string
	}{{"object", objectKeywords}, {"array", arrayKeywords}} {
		kw := g.typ
		for _, k := range g.keywords {
			if _, ok := m[k]; ok && len(types) > 0 && !slices.Contains(types, kw) {
				return &SchemaError{Path: path, Keyword: k, Reason: "applies only to type " + kw, Err: ErrInvalidSchema}
			}
		}
	}
	return nil
}

func (c *compiler) typed(m map[string]any, path string, depth int, t string) (uint16, error) {
	switch t {
	case "object":
		return c.object(m, path, depth)
	case "array":
		return c.array(m, path, depth)
	case "string":
		return c.add(node{kind: kString, minLen: 2})
	case "number":
		return c.add(node{kind: kNumber, minLen: 1})
	case "integer":
		return c.add(node{kind: kInteger, minLen: 1})
	case "boolean":
		return c.literal([]string{"true", "false"}, path, "type")
	}
	return c.literal([]string{"null"}, path, "type")
}

func (c *compiler) literal(texts []string, path, kw string) (uint16, error) {
	tr := newTrie()
	for i, s := range texts {
		if err := c.spend(len(s), path, kw); err != nil {
			return 0, err
		}
		tr.insert([]byte(s), i)
	}
	if err := trieFits(tr, path, kw); err != nil {
		return 0, err
	}
	tr.finish()
	return c.add(node{kind: kLiteral, lits: tr, minLen: tr.nodes[0].minEnd})
}

// enum compiles enum or const: scalar literals, each accepted exactly in
// its canonical JSON text.
func (c *compiler) enum(m map[string]any, path, kw string, types []string) (uint16, error) {
	for k := range m {
		if slices.Contains(objectKeywords, k) || slices.Contains(arrayKeywords, k) {
			return 0, &SchemaError{Path: path, Keyword: k, Reason: "not allowed beside " + kw, Err: ErrInvalidSchema}
		}
	}
	values := []any{m[kw]}
	if kw == "enum" {
		l, ok := m[kw].([]any)
		if !ok || len(l) == 0 {
			return 0, &SchemaError{Path: path, Keyword: kw, Reason: "a non-empty list is expected", Err: ErrInvalidSchema}
		}
		if len(l) > MaxEnumValues {
			return 0, &SchemaError{Path: path, Keyword: kw, Reason: "more than " + strconv.Itoa(MaxEnumValues) + " values", Err: ErrTooLarge}
		}
		values = l
	}
	var texts []string
	seen := make(map[string]bool, len(values))
	for _, v := range values {
		text, typ, err := literalText(v)
		if err != nil {
			return 0, &SchemaError{Path: path, Keyword: kw, Reason: err.Error(), Err: ErrUnsupported}
		}
		if len(types) > 0 && !slices.Contains(types, typ) && (typ != "integer" || !slices.Contains(types, "number")) {
			return 0, &SchemaError{Path: path, Keyword: kw, Reason: "value " + text + " is not of the node's type", Err: ErrInvalidSchema}
		}
		if !seen[text] {
			seen[text] = true
			texts = append(texts, text)
		}
	}
	return c.literal(texts, path, kw)
}

type literalError string

func (e literalError) Error() string { return string(e) }

// literalText returns the canonical JSON text of a scalar and its type.
func literalText(v any) (string, string, error) {
	switch v := v.(type) {
	case nil:
		return "null", "null", nil
	case bool:
		return strconv.FormatBool(v), "boolean", nil
	case json.Number:
		f, err := strconv.ParseFloat(v.String(), 64)
		if err != nil || math.IsInf(f, 0) {
			return "", "", literalError("number " + v.String() + " is out of range")
		}
		if f == math.Trunc(f) && !strings.ContainsAny(v.String(), ".eE") {
			return v.String(), "integer", nil
		}
		return v.String(), "number", nil
	case string:
		var b bytes.Buffer
		e := json.NewEncoder(&b)
		e.SetEscapeHTML(false)
		if err := e.Encode(v); err != nil {
			return "", "", literalError(err.Error())
		}
		return strings.TrimSuffix(b.String(), "\n"), "string", nil
	}
	return "", "", literalError("only scalar literals (string, number, boolean, null) are supported")
}

// validName reports whether a property name is valid UTF-8 that JSON
// writes without escapes: keys are matched byte for byte, unescaped.
func validName(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == '"' || s[i] == '\\' {
			return false
		}
	}
	return true
}
