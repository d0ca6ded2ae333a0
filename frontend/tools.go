package frontend

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// This file reads tools, tool_choice and parallel_tool_calls, compiles the
// tools into one schema for the engine's grammar, and reads the generated
// JSON back as OpenAI tool calls.
//
// The output of a call is {"<function>": <arguments>} (one property); with
// parallel_tool_calls it is {"tool_calls": [<call>, ...]} (at least one).
// Both start with '{', which is what tool_choice "auto" lets the model
// choose: the grammar binds only if the output's first byte is '{', and
// any other output is plain text. A call's id is a pure function of the
// request id and the call's index, so a migrated or taken over request,
// which regenerates the same tokens, delivers the same calls under the
// same ids, and never one twice.

// Bounds of tools: a grammar object holds at most MaxProperties.
const maxTools = grammar.MaxProperties

// Tool is one function a request may call, as admitted.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

// ToolCalls says how a request's output is read: as calls (Parallel: the
// array form), or as text when Optional and it does not start with '{'.
type ToolCalls struct {
	Parallel bool `json:"parallel,omitempty"`
	Optional bool `json:"optional,omitempty"`
}

// HistoryCall is a call of an assistant message of the chat history.
type HistoryCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// parseTools reads tools, tool_choice and parallel_tool_calls (chat), and
// refuses the legacy functions / function_call.
func parseTools(b *openAIRequest, out *CompletionRequest, chat bool) error {
	switch {
	case !rawIs(b.Functions):
		return unsupported("functions", "functions is deprecated and not supported: send tools (type function)")
	case !rawIs(b.FunctionCall):
		return unsupported("function_call", "function_call is deprecated and not supported: send tool_choice")
	case !chat && !(rawIs(b.Tools) && rawIs(b.ToolChoice) && b.ParallelToolCalls == nil):
		return unsupported(firstSet(b), "tool calls are a chat parameter: use /v1/chat/completions")
	}
	tools, err := readTools(b.Tools)
	if err != nil {
		return err
	}
	if len(tools) == 0 {
		if !rawIs(b.ToolChoice, `"none"`) {
			return invalid("tool_choice", "tool_choice needs tools")
		}
		if b.ParallelToolCalls != nil {
			return invalid("parallel_tool_calls", "parallel_tool_calls needs tools")
		}
		return nil
	}
	out.Tools = tools
	choice, named, err := readToolChoice(b.ToolChoice, tools)
	if err != nil || choice == "none" {
		return err
	}
	calls := &ToolCalls{Parallel: b.ParallelToolCalls == nil || *b.ParallelToolCalls, Optional: choice == "auto"}
	if named != "" {
		for _, t := range tools {
			if t.Name == named {
				tools = []Tool{t}
			}
		}
	}
	out.ToolCalls = calls
	out.Structured = &StructuredOutput{Kind: StructuredJSONSchema, Schema: toolSchema(tools, calls.Parallel), Optional: calls.Optional}
	return nil
}

func firstSet(b *openAIRequest) string {
	switch {
	case !rawIs(b.Tools):
		return "tools"
	case !rawIs(b.ToolChoice):
		return "tool_choice"
	}
	return "parallel_tool_calls"
}

// readTools reads and checks the tool definitions: functions with a name
// of OpenAI's pattern, unique, and parameters that are an object schema
// of the grammar's subset.
func readTools(raw json.RawMessage) ([]Tool, error) {
	if rawIs(raw, "[]") {
		return nil, nil
	}
	var defs []json.RawMessage
	if json.Unmarshal(raw, &defs) != nil {
		return nil, invalid("tools", "want an array of tools")
	}
	if len(defs) > maxTools {
		return nil, invalid("tools", "%d tools: at most %d", len(defs), maxTools)
	}
	seen := map[string]bool{}
	tools := make([]Tool, 0, len(defs))
	for i, d := range defs {
		t, err := readTool(i, d)
		if err != nil {
			return nil, err
		}
		if seen[t.Name] {
			return nil, invalid(fmt.Sprintf("tools[%d].function.name", i), "%q is defined twice", t.Name)
		}
		seen[t.Name] = true
		tools = append(tools, t)
	}
	return tools, nil
}

func readTool(i int, raw json.RawMessage) (Tool, error) {
	at := fmt.Sprintf("tools[%d]", i)
	var d struct {
		Type     string `json:"type"`
		Function *struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &d) != nil {
		return Tool{}, invalid(at, "want {\"type\": \"function\", \"function\": {...}}")
	}
	switch {
	case d.Type != "function":
		return Tool{}, unsupported(at+".type", fmt.Sprintf("%q: only function tools are supported", d.Type))
	case d.Function == nil:
		return Tool{}, &ParamError{Param: at + ".function", Code: CodeMissingRequired, Message: "function is required"}
	case !schemaName.MatchString(d.Function.Name):
		return Tool{}, invalid(at+".function.name", "%q: want 1 to 64 letters, digits, '_' or '-'", d.Function.Name)
	}
	params := d.Function.Parameters
	if rawIs(params) {
		params = json.RawMessage(`{"type":"object","properties":{}}`)
	}
	var obj struct {
		Type any `json:"type"`
	}
	if json.Unmarshal(params, &obj) != nil || obj.Type != "object" {
		return Tool{}, invalid(at+".function.parameters", "want an object schema ({\"type\": \"object\", ...})")
	}
	if _, err := grammar.Compile(params); err != nil {
		return Tool{}, schemaParamError(at+".function.parameters", "parameters", err)
	}
	var compact bytes.Buffer
	json.Compact(&compact, params) // valid: it compiled
	return Tool{Name: d.Function.Name, Description: d.Function.Description, Parameters: compact.Bytes()}, nil
}

// readToolChoice reads tool_choice: "none", "auto" (the default with
// tools), "required", or {"type": "function", "function": {"name"}}.
func readToolChoice(raw json.RawMessage, tools []Tool) (choice, named string, err error) {
	if rawIs(raw) {
		return "auto", "", nil
	}
	if json.Unmarshal(raw, &choice) == nil {
		switch choice {
		case "none", "auto", "required":
			return choice, "", nil
		}
		return "", "", invalid("tool_choice", "%q: want none, auto, required or a function", choice)
	}
	var c struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &c) != nil || c.Type != "function" {
		return "", "", invalid("tool_choice", "want none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}")
	}
	for _, t := range tools {
		if t.Name == c.Function.Name {
			return "required", t.Name, nil
		}
	}
	return "", "", invalid("tool_choice", "function %q is not one of the tools", c.Function.Name)
}

// toolSchema is the schema of the output that calls one of tools: an
// object with exactly one property, the function's name, whose value is
// its arguments; in the parallel form an object holding an array of such
// calls. It starts with '{' either way (tool_choice auto needs that).
func toolSchema(tools []Tool, parallel bool) json.RawMessage {
	props := make(map[string]json.RawMessage, len(tools))
	for _, t := range tools {
		props[t.Name] = t.Parameters
	}
	call := map[string]any{"type": "object", "properties": props, "minProperties": 1, "maxProperties": 1}
	if len(tools) == 1 {
		// One function: required says it all, in every grammar version.
		call = map[string]any{"type": "object", "properties": props, "required": []string{tools[0].Name}}
	}
	s := any(call)
	if parallel {
		s = map[string]any{"type": "object", "required": []string{"tool_calls"},
			"properties": map[string]any{"tool_calls": map[string]any{"type": "array", "minItems": 1, "items": call}}}
	}
	b, _ := json.Marshal(s) // maps of JSON: cannot fail
	return b
}

// callID is the id of a request's call number seq (0-based): a pure
// function of both.
func callID(requestID string, seq int) string {
	h := sha256.Sum256([]byte(requestID + "\x00tool_call\x00" + strconv.Itoa(seq)))
	return "call_" + hex.EncodeToString(h[:12])
}

// parseCalls reads a call output (the whole JSON value) as calls; false
// if it is not one (text, or cut short).
func parseCalls(requestID string, text []byte, parallel bool) ([]sse.ToolCall, bool) {
	var raws []json.RawMessage
	if parallel {
		var v struct {
			ToolCalls []json.RawMessage `json:"tool_calls"`
		}
		if json.Unmarshal(text, &v) != nil || len(v.ToolCalls) == 0 {
			return nil, false
		}
		raws = v.ToolCalls
	} else {
		raws = []json.RawMessage{text}
	}
	calls := make([]sse.ToolCall, 0, len(raws))
	for i, r := range raws {
		c, ok := oneCall(requestID, i, r)
		if !ok {
			return nil, false
		}
		calls = append(calls, c)
	}
	return calls, true
}

// oneCall reads {"<name>": <arguments>} as call number seq.
func oneCall(requestID string, seq int, raw json.RawMessage) (sse.ToolCall, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || len(m) != 1 {
		return sse.ToolCall{}, false
	}
	for name, args := range m {
		return sse.ToolCall{ID: callID(requestID, seq), Type: "function", Function: sse.FunctionCall{Name: name, Arguments: string(args)}}, true
	}
	return sse.ToolCall{}, false
}

// renderToolsPrompt is the tools' line of the chat template: the model
// sees the functions it may call.
func renderToolsPrompt(tools []Tool) string {
	b, _ := json.Marshal(tools)
	return "tools: " + string(b) + "\n"
}

// historyMessage reads a message of the chat history: its content, an
// assistant's tool calls, a tool message's tool_call_id.
func historyMessage(i int, m openAIMessage) (ChatMessage, error) {
	msg := ChatMessage{Role: m.Role}
	at := fmt.Sprintf("messages[%d]", i)
	switch {
	case m.Role == "tool" && (m.ToolCallID == nil || *m.ToolCallID == ""):
		return msg, &ParamError{Param: at + ".tool_call_id", Code: CodeMissingRequired, Message: "a tool message needs the tool_call_id it answers"}
	case m.Role != "tool" && m.ToolCallID != nil:
		return msg, unsupported(at+".tool_call_id", "only a tool message answers a tool call")
	case m.Role != "assistant" && !rawIs(m.ToolCalls):
		return msg, unsupported(at+".tool_calls", "only an assistant message holds tool calls")
	}
	if m.ToolCallID != nil {
		msg.ToolCallID = *m.ToolCallID
	}
	if !rawIs(m.ToolCalls, "[]") {
		var calls []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		}
		if json.Unmarshal(m.ToolCalls, &calls) != nil {
			return msg, invalid(at+".tool_calls", "want an array of {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}")
		}
		for j, c := range calls {
			if c.Type != "function" || c.Function.Name == "" || !json.Valid([]byte(c.Function.Arguments)) {
				return msg, invalid(fmt.Sprintf("%s.tool_calls[%d]", at, j), "want a function call with a name and JSON arguments")
			}
			msg.ToolCalls = append(msg.ToolCalls, HistoryCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
		if rawIs(m.Content) {
			return msg, nil // content is optional beside calls
		}
	}
	c, err := messageContent(i, m)
	msg.Content = c
	return msg, err
}

// renderHistoryCalls renders an assistant's calls in the chat template as
// the model writes them: {"<name>": <arguments>} each, after its text.
func renderHistoryCalls(calls []HistoryCall) string {
	var b bytes.Buffer
	for _, c := range calls {
		name, _ := json.Marshal(c.Name)
		fmt.Fprintf(&b, "{%s:%s}", name, c.Arguments) // checked JSON
	}
	return b.String()
}
