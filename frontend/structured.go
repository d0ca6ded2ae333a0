package frontend

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"

	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/decode/wire"
)

// This file reads response_format into a StructuredOutput, checks what
// combines with it, and turns the worker's refusal of a grammar into a 400
// naming the parameter the client set.

// Kinds of StructuredOutput.
const (
	StructuredJSONObject = "json_object"
	StructuredJSONSchema = "json_schema"
)

// StructuredOutput is the grammar a request's output follows. The worker
// compiles it and replays its state over the output's prefix, so it
// survives a migration like the sampler's seed does.
type StructuredOutput struct {
	Kind   string          `json:"kind"`
	Schema json.RawMessage `json:"schema,omitempty"`
	// Optional lets the output be free text instead: the grammar binds
	// only if its first byte is '{' (tool_choice auto).
	Optional bool `json:"optional,omitempty"`
	// automaton is Schema compiled at admission, so that checks after
	// parsing do not compile it again (nil in a body read from a record).
	automaton *grammar.Automaton
}

// wire is the Generate field of s (nil for none).
func (s *StructuredOutput) wire() *wire.Structured {
	if s == nil {
		return nil
	}
	w := &wire.Structured{Kind: wire.Structured_JSON_OBJECT, Optional: s.Optional}
	if s.Kind == StructuredJSONSchema {
		w.Kind, w.Schema = wire.Structured_JSON_SCHEMA, s.Schema
	}
	return w
}

// schemaName is OpenAI's pattern for json_schema.name and function names.
var schemaName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// parseResponseFormat reads response_format: unset or {"type":"text"} is
// free text; {"type":"json_object"} any JSON object; {"type":"json_schema",
// "json_schema":{"name","schema","strict"}} the schema's values, compiled
// here so that a schema the engine cannot follow is a 400 before anything
// runs. The worker compiles the same schema with the same package.
func parseResponseFormat(raw json.RawMessage) (*StructuredOutput, error) {
	if rawIs(raw) {
		return nil, nil
	}
	var f struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Schema      json.RawMessage `json:"schema"`
			Strict      *bool           `json:"strict"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, invalid("response_format", "want an object {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}")
	}
	switch f.Type {
	case "text":
		return nil, nil
	case StructuredJSONObject:
		return &StructuredOutput{Kind: StructuredJSONObject}, nil
	case StructuredJSONSchema:
	default:
		return nil, invalid("response_format", "type %q: want text, json_object or json_schema", f.Type)
	}
	js := f.JSONSchema
	switch {
	case js == nil:
		return nil, &ParamError{Param: "response_format", Code: CodeMissingRequired, Message: "type json_schema needs a json_schema object"}
	case !schemaName.MatchString(js.Name):
		return nil, invalid("response_format", "json_schema.name %q: want 1 to 64 letters, digits, '_' or '-'", js.Name)
	case rawIs(js.Schema):
		// OpenAI allows a schema-less json_schema: any JSON object.
		return &StructuredOutput{Kind: StructuredJSONObject}, nil
	}
	a, err := grammar.Compile(js.Schema)
	if err != nil {
		return nil, schemaParamError("response_format", "json_schema.schema", err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, js.Schema); err != nil {
		return nil, invalid("response_format", "json_schema.schema is not JSON: %v", err)
	}
	// strict: true or false, the grammar enforces the schema strictly.
	return &StructuredOutput{Kind: StructuredJSONSchema, Schema: compact.Bytes(), automaton: a}, nil
}

// schemaParamError is a refused schema as a 400 naming param; where says
// which part of the parameter held the schema.
func schemaParamError(param, where string, err error) *ParamError {
	var se *grammar.SchemaError
	if errors.As(err, &se) {
		at := se.Path
		if at == "" {
			at = "/"
		}
		code := CodeInvalidValue
		if errors.Is(err, grammar.ErrUnsupported) {
			code = CodeUnsupportedParameter
		}
		msg := where + " at " + at + ": "
		if se.Keyword != "" {
			msg += "keyword \"" + se.Keyword + "\": "
		}
		return &ParamError{Param: param, Code: code, Message: msg + se.Reason}
	}
	return invalid(param, "%s: %v", where, strings.TrimPrefix(err.Error(), "grammar: "))
}

// checkStructured checks what a request's grammar combines with, once
// every parameter is read. A stop sequence could end the output inside the
// value (invalid JSON), and ignore_eos would ask the engine to go on past
// a closed value; both are refused rather than silently breaking the
// JSON. max_tokens must leave room for the shortest valid value: the
// engine closes the value within the budget, never cuts it.
func checkStructured(out *CompletionRequest) error {
	s := out.Structured
	if s == nil {
		return nil
	}
	param := "response_format"
	if out.ToolCalls != nil {
		param = "tools"
	}
	switch {
	case len(out.Stop) > 0:
		return unsupported("stop", "stop sequences cannot be combined with "+param+": a stop could end the output inside the JSON value")
	case out.IgnoreEOS:
		return unsupported("ignore_eos", "ignore_eos cannot be combined with "+param+": the output ends when the JSON value closes")
	}
	if s.Kind == StructuredJSONObject {
		if out.maxTokens() < 2 {
			return invalid("max_tokens", "max_tokens %d is too small for a JSON object: at least 2 tokens", out.maxTokens())
		}
		return nil
	}
	a, err := s.compiled()
	if err != nil {
		if out.ToolCalls != nil {
			// Each function's parameters compiled alone; together, under
			// the call's wrapper, they may not.
			return schemaParamError(param, "the tools together", err)
		}
		return schemaParamError(param, "json_schema.schema", err)
	}
	if out.ToolCalls != nil {
		// The worker checks max_tokens against the calls' grammar (with
		// tool_choice auto the output may be text); its refusal is mapped
		// to max_tokens.
		return nil
	}
	if need := a.MinClose(a.Start()); out.maxTokens() < need {
		return invalid("max_tokens", "max_tokens %d is too small: the shortest value of the schema takes %d tokens", out.maxTokens(), need)
	}
	return nil
}

// compiled is s's automaton, compiled once.
func (s *StructuredOutput) compiled() (*grammar.Automaton, error) {
	if s.automaton != nil {
		return s.automaton, nil
	}
	a, err := grammar.Compile(s.Schema)
	s.automaton = a
	return a, err
}

// structuredParamError names the parameter a worker's refusal of a
// request with a grammar is about: its grammar (response_format, or tools)
// or its max_tokens; other refusals keep the worker's field.
func structuredParamError(body *CompletionRequest, pe *ParamError) *ParamError {
	if body.Structured == nil {
		return pe
	}
	grammarParam := "response_format"
	if body.ToolCalls != nil {
		grammarParam = "tools"
	}
	switch {
	case pe.Param == "max_tokens" || strings.Contains(pe.Message, "max_tokens"):
		pe.Param = "max_tokens"
		if body.MaxTokens == nil {
			pe.Message += " (max_tokens defaults to 16: set a larger one)"
		}
	case pe.Param == "response_format" || strings.HasPrefix(pe.Param, "structured") || strings.HasPrefix(pe.Param, "schema") ||
		strings.Contains(pe.Message, "schema"):
		pe.Param = grammarParam
	}
	return pe
}

// parseOutputShape reads what shapes the output beyond sampling:
// logprobs, echo, response_format, tools; then checks how they combine.
func parseOutputShape(b *openAIRequest, out *CompletionRequest, chat bool) error {
	if err := parseLogprobs(b, out, chat); err != nil {
		return err
	}
	if b.Echo != nil && *b.Echo {
		switch {
		case chat:
			return unsupported("echo", "echo is a completions parameter")
		case out.Logprobs:
			// The worker computes the output's logprobs, not the prompt's.
			return unsupported("echo", "echo together with logprobs is not supported: the prompt's logprobs are not computed")
		}
		out.Echo = true
	}
	s, err := parseResponseFormat(b.ResponseFormat)
	if err != nil {
		return err
	}
	out.Structured = s
	if err := parseTools(b, out, chat); err != nil {
		return err
	}
	if s != nil && out.ToolCalls != nil {
		return unsupported("response_format", "response_format cannot be combined with tool calls (tool_choice none leaves the format to response_format)")
	}
	if s != nil {
		out.Structured = s
	}
	if len(out.Tools) > 0 {
		out.Prompt = renderToolsPrompt(out.Tools) + out.Prompt
	}
	return checkStructured(out)
}
