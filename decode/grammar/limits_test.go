package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// enumSchema is {"enum": [n distinct strings of size bytes]}.
func enumSchema(n, size int) ([]byte, []string) {
	vals := make([]string, n)
	for i := range vals {
		v := fmt.Sprintf("%08d", i)
		vals[i] = v + strings.Repeat("x", size-len(v)) // distinct from the start: a trie node a byte
	}
	b, _ := json.Marshal(map[string]any{"enum": vals})
	return b, vals
}

func TestCompileBoundsLiterals(t *testing.T) {
	names := func(n, size int) []byte {
		props := map[string]any{}
		for i := range n {
			v := fmt.Sprintf("%04d", i)
			props[v+strings.Repeat("k", size-len(v))] = map[string]any{"type": "null"}
		}
		b, _ := json.Marshal(map[string]any{"type": "object", "properties": props})
		return b
	}
	huge, _ := enumSchema(30000, 128)
	many, _ := enumSchema(MaxEnumValues+1, 8)
	atMost, _ := enumSchema(MaxEnumValues, 8)
	long, _ := enumSchema(700, 103) // ~72.8k trie nodes: past uint16 positions
	tests := []struct {
		name    string
		schema  []byte
		keyword string // "" accepted
	}{
		{"30k enum values of 128 bytes", huge, "enum"},
		{"one enum value too many", many, "enum"},
		{"MaxEnumValues values", atMost, ""},
		{"enum texts past MaxLiteralBytes", long, "enum"},
		{"property names past MaxLiteralBytes", names(MaxProperties, 1100), "properties"},
		{"property names under MaxLiteralBytes", names(MaxProperties, 900), ""},
	}
	for _, tc := range tests {
		_, err := Compile(tc.schema)
		var se *SchemaError
		switch {
		case tc.keyword == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.keyword != "" && (!errors.Is(err, ErrTooLarge) || !errors.As(err, &se) || se.Keyword != tc.keyword):
			t.Errorf("%s: err %v, want ErrTooLarge on %q", tc.name, err, tc.keyword)
		}
	}
}

// TestCompileBoundsLiteralsAcrossNodes: the byte bound is the schema's,
// not one node's.
func TestCompileBoundsLiteralsAcrossNodes(t *testing.T) {
	_, vals := enumSchema(300, 103)
	props := map[string]any{}
	for _, k := range []string{"a", "b", "c"} {
		props[k] = map[string]any{"enum": vals}
	}
	b, _ := json.Marshal(map[string]any{"type": "object", "properties": props})
	if _, err := Compile(b); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("3 enums of ~31 KiB each: %v, want ErrTooLarge", err)
	}
}

// TestLargeLiteralTrieReplays: a schema just under the bounds, whose
// trie positions go past 32k, accepts every value through Replay (the
// path a worker that takes a request over follows).
func TestLargeLiteralTrieReplays(t *testing.T) {
	b, vals := enumSchema(600, 103)
	a, err := Compile(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 299, 599} {
		text, _ := json.Marshal(vals[i])
		s, err := a.Replay([][]byte{text[:50], text[50:]})
		if err != nil || !a.Accepting(s) {
			t.Fatalf("value %d: err %v, accepting %v", i, err, a.Accepting(s))
		}
	}
}

// TestTrieFits: a trie whose positions would reach offTrie is refused,
// whatever the byte bound allows.
func TestTrieFits(t *testing.T) {
	tr := newTrie()
	for i := range 700 {
		tr.insert([]byte(fmt.Sprintf("%08d%s", i, strings.Repeat("x", 95))), i)
	}
	if len(tr.nodes) <= maxTrieNodes {
		t.Fatalf("test trie has %d nodes", len(tr.nodes))
	}
	if err := trieFits(tr, "", "enum"); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("trieFits: %v, want ErrTooLarge", err)
	}
	small := newTrie()
	small.insert([]byte("x"), 0)
	if err := trieFits(small, "", "enum"); err != nil {
		t.Fatal(err)
	}
}
