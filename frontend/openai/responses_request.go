package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ResponseRequest is a POST /v1/responses body as a client sends it.
// Numbers and polymorphic fields stay raw: the frontend reads them with
// the Chat Completions parser, so that both APIs accept and refuse the
// same values.
type ResponseRequest struct {
	Model              string            `json:"model"`
	Input              json.RawMessage   `json:"input"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    json.RawMessage   `json:"max_output_tokens"`
	Temperature        json.RawMessage   `json:"temperature"`
	TopP               json.RawMessage   `json:"top_p"`
	Text               *ResponseText     `json:"text"`
	Tools              []ResponseTool    `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"`
	Stream             *bool             `json:"stream"`
	Background         *bool             `json:"background"`
	Store              *bool             `json:"store"`
	Metadata           map[string]string `json:"metadata"`
	PreviousResponseID *string           `json:"previous_response_id"`
	// Extensions, as in Chat Completions: seed, top_k, timeout_ms,
	// priority, ignore_eos.
	Seed      json.RawMessage `json:"seed"`
	TopK      json.RawMessage `json:"top_k"`
	TimeoutMs json.RawMessage `json:"timeout_ms"`
	Priority  json.RawMessage `json:"priority"`
	IgnoreEOS json.RawMessage `json:"ignore_eos"`
	// Known, refused unless at their default.
	Reasoning         json.RawMessage `json:"reasoning"`
	Include           json.RawMessage `json:"include"`
	Conversation      json.RawMessage `json:"conversation"`
	Prompt            json.RawMessage `json:"prompt"`
	TopLogprobs       json.RawMessage `json:"top_logprobs"`
	MaxToolCalls      json.RawMessage `json:"max_tool_calls"`
	ContextManagement json.RawMessage `json:"context_management"`
	Truncation        *string         `json:"truncation"`
	ServiceTier       *string         `json:"service_tier"`
}

// ResponseText is the text parameter: the output's format.
type ResponseText struct {
	Format    json.RawMessage `json:"format"`
	Verbosity *string         `json:"verbosity"`
}

// ResponseTool is a tool of a request: a function (the only type served).
type ResponseTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// Metadata's bounds, as OpenAI's.
const (
	MaxMetadataPairs = 16
	MaxMetadataKey   = 64
	MaxMetadataValue = 512
)

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

func unsupportedParam(param, why string) *ParamError {
	return &ParamError{Param: param, Code: CodeUnsupportedParameter, Message: why}
}

func invalidParam(param, format string, args ...any) *ParamError {
	return &ParamError{Param: param, Code: CodeInvalidValue, Message: fmt.Sprintf(format, args...)}
}

// ParseResponseRequest reads a body and refuses what is not served, each
// refusal a *ParamError naming its parameter; a body that is not JSON is
// another error.
func ParseResponseRequest(data []byte) (ResponseRequest, error) {
	var r ResponseRequest
	if !utf8.Valid(data) {
		return r, invalidParam("input", "the body is not valid UTF-8")
	}
	if err := json.Unmarshal(data, &r); err != nil {
		if te, ok := err.(*json.UnmarshalTypeError); ok && te.Field != "" {
			return r, invalidParam(te.Field, "%s must be a %s (got a JSON %s)", te.Field, te.Type, te.Value)
		}
		return r, fmt.Errorf("malformed JSON: %w", err)
	}
	if err := r.refuse(); err != nil {
		return r, err
	}
	if r.Model == "" {
		return r, &ParamError{Param: "model", Code: CodeMissingRequired, Message: "model is required"}
	}
	if isNull(r.Input) {
		return r, &ParamError{Param: "input", Code: CodeMissingRequired, Message: "input is required: a string or a list of items"}
	}
	if len(r.Metadata) > MaxMetadataPairs {
		return r, invalidParam("metadata", "%d pairs: at most %d", len(r.Metadata), MaxMetadataPairs)
	}
	for k, v := range r.Metadata {
		if len(k) > MaxMetadataKey || len(v) > MaxMetadataValue {
			return r, invalidParam("metadata", "key %.64q: keys are at most %d characters, values %d", k, MaxMetadataKey, MaxMetadataValue)
		}
	}
	for i, t := range r.Tools {
		if t.Type != "function" {
			return r, unsupportedParam(fmt.Sprintf("tools[%d].type", i), fmt.Sprintf("%q: only function tools are served", t.Type))
		}
	}
	if r.Background != nil && *r.Background && r.Store != nil && !*r.Store {
		return r, invalidParam("store", "a background response is stored: store must not be false")
	}
	return r, nil
}

// refuse names the first known parameter that is set and not served.
func (r *ResponseRequest) refuse() error {
	switch {
	case !isNull(r.Reasoning):
		return unsupportedParam("reasoning", "the models served are not reasoning models")
	case !isNull(r.Include) && string(bytes.TrimSpace(r.Include)) != "[]":
		return unsupportedParam("include", "no additional output data is served")
	case !isNull(r.Conversation):
		return unsupportedParam("conversation", "conversations are not served: continue with previous_response_id")
	case !isNull(r.Prompt):
		return unsupportedParam("prompt", "prompt templates are not served: send input and instructions")
	case !isNull(r.TopLogprobs):
		return unsupportedParam("top_logprobs", "logprobs are served by /v1/chat/completions, not here")
	case !isNull(r.MaxToolCalls):
		return unsupportedParam("max_tool_calls", "max_tool_calls is not served")
	case !isNull(r.ContextManagement):
		return unsupportedParam("context_management", "context management (compaction) is not served")
	case r.Truncation != nil && *r.Truncation != "disabled":
		return unsupportedParam("truncation", fmt.Sprintf("%q: only disabled (an input over the context is refused)", *r.Truncation))
	case r.ServiceTier != nil && *r.ServiceTier != "auto" && *r.ServiceTier != "default":
		return unsupportedParam("service_tier", "only the default service tier is served")
	case r.Text != nil && r.Text.Verbosity != nil && *r.Text.Verbosity != "medium":
		return unsupportedParam("text.verbosity", "only medium verbosity is served")
	}
	return nil
}

// rawItem is an input item as a client sends it: an easy message (role
// and content), a message item, a function call or a function call's
// output.
type rawItem struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// InputItems reads input, a string or a list of items, into items with
// their content as parts; the items' ids are made from prefix where the
// client gave none.
func InputItems(input json.RawMessage, prefix string) ([]OutputItem, error) {
	var s string
	if json.Unmarshal(input, &s) == nil {
		return []OutputItem{{ID: prefix + "_0", Type: ItemMessage, Status: StatusCompleted, Role: "user", Content: []ContentPart{{Type: PartInputText, Text: s}}}}, nil
	}
	var raw []rawItem
	if err := json.Unmarshal(input, &raw); err != nil {
		return nil, invalidParam("input", "want a string or a list of items: %v", err)
	}
	if len(raw) == 0 {
		return nil, invalidParam("input", "the input must not be empty")
	}
	items := make([]OutputItem, len(raw))
	for i, r := range raw {
		it, err := inputItem(fmt.Sprintf("input[%d]", i), r)
		if err != nil {
			return nil, err
		}
		if it.ID == "" {
			it.ID = fmt.Sprintf("%s_%d", prefix, i)
		}
		items[i] = it
	}
	return items, nil
}

func inputItem(at string, r rawItem) (OutputItem, error) {
	it := OutputItem{ID: r.ID, Type: r.Type, Status: StatusCompleted}
	switch r.Type {
	case "", ItemMessage:
		it.Type, it.Role = ItemMessage, r.Role
		switch r.Role {
		case "user", "system", "developer", "assistant":
		case "":
			return it, &ParamError{Param: at + ".role", Code: CodeMissingRequired, Message: "a message needs a role"}
		default:
			return it, invalidParam(at+".role", "%q: want user, system, developer or assistant", r.Role)
		}
		parts, err := contentParts(at+".content", r.Content, r.Role == "assistant")
		it.Content = parts
		return it, err
	case ItemFunctionCall:
		if r.CallID == "" || r.Name == "" {
			return it, &ParamError{Param: at + ".call_id", Code: CodeMissingRequired, Message: "a function_call item needs call_id and name"}
		}
		if !json.Valid([]byte(r.Arguments)) {
			return it, invalidParam(at+".arguments", "the arguments are not JSON")
		}
		it.CallID, it.Name, it.Arguments = r.CallID, r.Name, r.Arguments
		return it, nil
	case ItemFunctionCallOutput:
		if r.CallID == "" {
			return it, &ParamError{Param: at + ".call_id", Code: CodeMissingRequired, Message: "a function_call_output item needs the call_id it answers"}
		}
		var out string
		if err := json.Unmarshal(r.Output, &out); err != nil {
			return it, invalidParam(at+".output", "the output must be a string")
		}
		it.CallID, it.Output = r.CallID, out
		return it, nil
	}
	return it, unsupportedParam(at+".type", fmt.Sprintf("%q: input items are messages, function_call and function_call_output", r.Type))
}

// contentParts reads a message's content: a string, or a list of text
// parts (input_text; output_text in an assistant's message).
func contentParts(at string, raw json.RawMessage, assistant bool) ([]ContentPart, error) {
	kind := PartInputText
	if assistant {
		kind = PartOutputText
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []ContentPart{{Type: kind, Text: s}}, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, invalidParam(at, "want a string or a list of content parts")
	}
	out := make([]ContentPart, len(parts))
	for j, p := range parts {
		switch {
		case p.Type != PartInputText && p.Type != PartOutputText:
			return nil, unsupportedParam(fmt.Sprintf("%s[%d].type", at, j), fmt.Sprintf("%q: only text parts are served (the models read text)", p.Type))
		case p.Text == nil:
			return nil, &ParamError{Param: fmt.Sprintf("%s[%d].text", at, j), Code: CodeMissingRequired, Message: "a text part needs its text"}
		}
		out[j] = ContentPart{Type: p.Type, Text: *p.Text}
	}
	return out, nil
}

// PartsText is the text of parts, joined.
func PartsText(parts []ContentPart) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}
