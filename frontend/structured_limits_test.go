package frontend

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/grammar"
)

// TestSchemaBoundsAtAdmission: what the worker would refuse (or spend
// seconds and megabytes on) is a 400 naming the client's parameter
// before anything runs: a huge enum, tools that compile one by one but
// not together (nodes, depth once the call's wrapper adds levels).
func TestSchemaBoundsAtAdmission(t *testing.T) {
	tool := func(name, params string) string {
		return `{"type":"function","function":{"name":"` + name + `","parameters":` + params + `}}`
	}
	vals := make([]string, 30000)
	for i := range vals {
		vals[i] = fmt.Sprintf("%08d%s", i, strings.Repeat("x", 120))
	}
	enum, _ := json.Marshal(map[string]any{"enum": vals})
	hugeParams := `{"type":"object","properties":{"a":` + string(enum) + `}}`
	var props []string
	for i := range 25 {
		props = append(props, fmt.Sprintf(`"p%d":{"type":"array","items":{"type":"string"}}`, i))
	}
	wide := `{"type":"object","properties":{` + strings.Join(props, ",") + `}}`
	var tools []string
	for i := range 10 {
		tools = append(tools, tool(fmt.Sprintf("f%d", i), wide))
	}
	deep := strings.Repeat(`{"type":"object","properties":{"a":`, grammar.MaxDepth-1) + `{"type":"null"}` + strings.Repeat(`}}`, grammar.MaxDepth-1)
	if _, err := grammar.Compile([]byte(deep)); err != nil {
		t.Fatalf("deep parameters alone: %v", err)
	}
	for _, tc := range []struct {
		name, body, param string
	}{
		{"huge enum in response_format", `{` + chatA + `,"max_tokens":4000,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":` + string(enum) + `}}}`, "response_format"},
		{"huge enum in a tool", `{` + chatA + `,"tools":[` + tool("f", hugeParams) + `]}`, "tools[0].function.parameters"},
		{"10 tools of 25 parameters", `{` + chatA + `,"tools":[` + strings.Join(tools, ",") + `],"tool_choice":"required"}`, "tools"},
		{"deep parameters in the parallel wrapper", `{` + chatA + `,"tools":[` + tool("f", deep) + `]}`, "tools"},
	} {
		b, err := parseRequest([]byte(tc.body), true)
		if err == nil {
			err = b.validate()
		}
		var pe *ParamError
		if !errors.As(err, &pe) || pe.Param != tc.param || pe.Code != CodeInvalidValue {
			t.Errorf("%s: got %v, want a 400 on %s", tc.name, err, tc.param)
		}
	}
}

// TestSchemaCompiledOnce: the automaton compiled while parsing is the one
// the later checks use (a schema is not compiled twice per request).
func TestSchemaCompiledOnce(t *testing.T) {
	schema := `{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}`
	for _, body := range []string{
		`{` + chatA + `,"max_tokens":64,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":` + schema + `}}}`,
		`{` + chatA + `,"tools":[{"type":"function","function":{"name":"f","parameters":` + schema + `}}]}`,
	} {
		b, err := parseRequest([]byte(body), true)
		if err != nil {
			t.Fatal(err)
		}
		s := b.Structured
		if s == nil || s.automaton == nil {
			t.Fatalf("%s: no automaton kept from admission", body)
		}
		a := s.automaton
		s.Schema = json.RawMessage(`not a schema`) // a recompile would fail
		if err := checkStructured(&b); err != nil || s.automaton != a {
			t.Fatalf("%s: checked again by compiling: %v", body, err)
		}
	}
}
