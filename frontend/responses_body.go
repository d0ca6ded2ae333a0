package frontend

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
)

// A request of the Responses API runs as a chat request: its body is
// translated into a Chat Completions body and read by the same parser,
// so that both APIs accept and refuse the same values (a refusal names
// the Responses parameter). What the response object echoes, and what a
// later response continues, is kept beside it in responseMeta, and so
// in the request record.

// responseMeta is what a Responses request keeps beside the chat request
// it runs as (CompletionRequest.Response).
type responseMeta struct {
	Background   bool              `json:"background,omitempty"`
	Store        bool              `json:"store"`
	Instructions *string           `json:"instructions,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	Previous     string            `json:"previous,omitempty"`
	Tools        json.RawMessage   `json:"tools,omitempty"`
	ToolChoice   json.RawMessage   `json:"tool_choice,omitempty"`
	Text         json.RawMessage   `json:"text,omitempty"`
	Parallel     bool              `json:"parallel,omitempty"`
	// Input is this response's input items (GET .../input_items).
	Input []openai.OutputItem `json:"input"`
	// Credential is the SHA-256 of the bearer credential that created
	// the response ("": none was sent): only the same one reads it.
	Credential string `json:"credential,omitempty"`
	CreatedAt  int64  `json:"created_at"`
	// Lead: the chat request's first message is the instructions, which
	// a later response does not carry over.
	Lead bool `json:"lead,omitempty"`
}

// newResponseID is a response's id, which is also its request's: random
// (128 bits), so that nobody finds another's response by counting.
func newResponseID() string {
	var b [16]byte
	rand.Read(b[:])
	return "resp_" + hex.EncodeToString(b[:])
}

// credentialOf is the hash of a request's credential ("": none): the
// bearer token (the scheme matched in any case), or the whole
// Authorization value under another scheme.
func credentialOf(req *http.Request) string {
	v, ok := bearer(req)
	if !ok {
		v = strings.TrimSpace(req.Header.Get("Authorization"))
	}
	if v == "" {
		return ""
	}
	h := sha256.Sum256([]byte(v))
	return hex.EncodeToString(h[:])
}

// sameCredential: req may read a response created with credential.
func sameCredential(credential string, req *http.Request) bool {
	return subtle.ConstantTimeCompare([]byte(credential), []byte(credentialOf(req))) == 1
}

// chatParams maps the chat parser's parameter names back to the
// Responses API's, longest first.
var chatParams = []struct{ chat, responses string }{
	{"response_format.json_schema.", "text.format."},
	{"response_format", "text.format"},
	{"max_tokens", "max_output_tokens"},
	{"messages", "input"},
	{".function.", "."},
	{"tool_choice.function", "tool_choice"},
}

func responsesParam(err error) error { return responsesParamAt(err, 0, false) }

// responsesParamAt is responsesParam for a chat request whose messages
// are the instructions (lead), a continued conversation, then the input
// from message offset on: messages[i] is named input[i-offset] (about:
// consecutive function calls are one message), instructions or
// previous_response_id.
func responsesParamAt(err error, offset int, lead bool) error {
	var pe *ParamError
	if !errors.As(err, &pe) {
		return err
	}
	out := *pe
	if rest, ok := strings.CutPrefix(out.Param, "messages["); ok {
		n, tail, _ := strings.Cut(rest, "]")
		i, convErr := strconv.Atoi(n)
		switch {
		case convErr != nil:
		case i >= offset:
			out.Param = fmt.Sprintf("input[%d]%s", i-offset, tail)
		case lead && i == 0:
			out.Param = "instructions"
		default:
			out.Param = "previous_response_id"
		}
	}
	for _, m := range chatParams {
		out.Param = strings.Replace(out.Param, m.chat, m.responses, 1)
	}
	return &out
}

// decodeResponse reads a POST /v1/responses body into the chat request it
// runs as, under id. previous finds a stored response to continue.
func (s *Server) decodeResponse(ctx context.Context, data []byte, req *http.Request, id string) (CompletionRequest, error) {
	rr, err := openai.ParseResponseRequest(data)
	if err != nil {
		return CompletionRequest{}, err
	}
	items, err := openai.InputItems(rr.Input, "in_"+strings.TrimPrefix(id, "resp_"))
	if err != nil {
		return CompletionRequest{}, err
	}
	meta := &responseMeta{Background: rr.Background != nil && *rr.Background, Store: rr.Store == nil || *rr.Store,
		Instructions: rr.Instructions, Metadata: rr.Metadata, Input: items, Credential: credentialOf(req), ToolChoice: rr.ToolChoice,
		Parallel: rr.ParallelToolCalls == nil || *rr.ParallelToolCalls}
	var msgs []map[string]any
	if rr.Instructions != nil {
		msgs, meta.Lead = append(msgs, map[string]any{"role": "system", "content": *rr.Instructions}), true
	}
	if rr.PreviousResponseID != nil {
		meta.Previous = *rr.PreviousResponseID
		prev, err := s.previousConversation(ctx, meta.Previous, req)
		if err != nil {
			return CompletionRequest{}, err
		}
		msgs = append(msgs, prev...)
	}
	offset := len(msgs)
	msgs = append(msgs, itemMessages(items)...)
	chat := map[string]any{"model": rr.Model, "messages": msgs, "stream": rr.Stream != nil && *rr.Stream}
	for k, v := range map[string]json.RawMessage{"max_tokens": rr.MaxOutputTokens, "temperature": rr.Temperature, "top_p": rr.TopP,
		"seed": rr.Seed, "top_k": rr.TopK, "timeout_ms": rr.TimeoutMs, "priority": rr.Priority, "ignore_eos": rr.IgnoreEOS} {
		if len(v) > 0 {
			chat[k] = v
		}
	}
	if err := chatTools(rr, meta, chat); err != nil {
		return CompletionRequest{}, err
	}
	b, err := json.Marshal(chat)
	if err != nil {
		return CompletionRequest{}, err
	}
	body, err := decodeCompletion(b, req, true)
	if err != nil {
		return body, responsesParamAt(err, offset, meta.Lead)
	}
	body.Response = meta
	return body, nil
}

// chatTools puts the tools, tool_choice, parallel_tool_calls and the text
// format into the chat body, and what the response echoes into meta.
func chatTools(rr openai.ResponseRequest, meta *responseMeta, chat map[string]any) error {
	var tools []map[string]any
	for _, t := range rr.Tools {
		f := map[string]any{"name": t.Name, "description": t.Description, "parameters": t.Parameters}
		if t.Strict != nil {
			f["strict"] = *t.Strict
		}
		tools = append(tools, map[string]any{"type": "function", "function": f})
	}
	if tools != nil {
		chat["tools"] = tools
	}
	meta.Tools, _ = json.Marshal(rr.Tools)
	if rr.Tools == nil {
		meta.Tools = json.RawMessage("[]")
	}
	if len(rr.ToolChoice) > 0 {
		var named struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if json.Unmarshal(rr.ToolChoice, &named) == nil && named.Type == "function" {
			chat["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": named.Name}}
		} else {
			chat["tool_choice"] = rr.ToolChoice
		}
	} else {
		meta.ToolChoice = json.RawMessage(`"auto"`)
	}
	if rr.ParallelToolCalls != nil {
		chat["parallel_tool_calls"] = *rr.ParallelToolCalls
	}
	meta.Text = json.RawMessage(`{"format":{"type":"text"}}`)
	if rr.Text == nil || len(rr.Text.Format) == 0 {
		return nil
	}
	meta.Text, _ = json.Marshal(map[string]json.RawMessage{"format": rr.Text.Format})
	var f struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Schema      json.RawMessage `json:"schema"`
		Strict      *bool           `json:"strict"`
	}
	if err := json.Unmarshal(rr.Text.Format, &f); err != nil {
		return invalid("text.format", "want an object with a type: %v", err)
	}
	switch f.Type {
	case "text":
	case "json_object":
		chat["response_format"] = map[string]any{"type": "json_object"}
	case "json_schema":
		js := map[string]any{"name": f.Name, "schema": f.Schema}
		if f.Description != "" {
			js["description"] = f.Description
		}
		if f.Strict != nil {
			js["strict"] = *f.Strict
		}
		chat["response_format"] = map[string]any{"type": "json_schema", "json_schema": js}
	default:
		return invalid("text.format.type", "%q: want text, json_object or json_schema", f.Type)
	}
	return nil
}

// itemMessages are input items as chat messages: consecutive function
// calls one assistant message with its calls, a call's output a tool
// message.
func itemMessages(items []openai.OutputItem) []map[string]any {
	var out []map[string]any
	for _, it := range items {
		switch it.Type {
		case openai.ItemMessage:
			out = append(out, map[string]any{"role": it.Role, "content": openai.PartsText(it.Content)})
		case openai.ItemFunctionCall:
			call := map[string]any{"id": it.CallID, "type": "function", "function": map[string]any{"name": it.Name, "arguments": it.Arguments}}
			if k := len(out) - 1; k >= 0 && out[k]["role"] == "assistant" && out[k]["tool_calls"] != nil {
				out[k]["tool_calls"] = append(out[k]["tool_calls"].([]any), call)
				continue
			}
			out = append(out, map[string]any{"role": "assistant", "tool_calls": []any{call}})
		case openai.ItemFunctionCallOutput:
			out = append(out, map[string]any{"role": "tool", "tool_call_id": it.CallID, "content": it.Output})
		}
	}
	return out
}

// chatMessages are a stored conversation's messages back in the chat
// shape the parser reads.
func chatMessages(msgs []ChatMessage) []map[string]any {
	out := make([]map[string]any, 0, len(msgs))
	for _, m := range msgs {
		c := map[string]any{"role": m.Role, "content": m.Content}
		if m.ToolCallID != "" {
			c["tool_call_id"] = m.ToolCallID
		}
		var calls []any
		for _, h := range m.ToolCalls {
			calls = append(calls, map[string]any{"id": h.ID, "type": "function", "function": map[string]any{"name": h.Name, "arguments": h.Arguments}})
		}
		if calls != nil {
			c["tool_calls"] = calls
			if m.Content == "" {
				delete(c, "content")
			}
		}
		out = append(out, c)
	}
	return out
}

// Codes of the Responses API's refusals.
const (
	CodeResponseNotFound   = "response_not_found"
	CodePreviousNotUsable  = "previous_response_not_usable"
	CodeStartingAfterRange = "starting_after_out_of_range"
)

// previousConversation is the conversation of stored response id — its
// messages but its instructions, then its output as the assistant's
// message — for a response that continues it.
func (s *Server) previousConversation(ctx context.Context, id string, req *http.Request) ([]map[string]any, error) {
	st, err := s.storedResponse(ctx, id, req)
	if err != nil {
		var re *responseRefusal
		if errors.As(err, &re) && re.status == http.StatusNotFound {
			return nil, &ParamError{Param: "previous_response_id", Code: CodeResponseNotFound, Message: re.msg}
		}
		return nil, err
	}
	done, r, _ := st.state()
	switch {
	case !done:
		return nil, &ParamError{Param: "previous_response_id", Code: CodePreviousNotUsable, Message: id + " is still in progress: continue it once it has completed"}
	case r.Err != nil:
		return nil, &ParamError{Param: "previous_response_id", Code: CodePreviousNotUsable, Message: fmt.Sprintf("%s did not complete (%s): there is no output to continue", id, r.Err.Type)}
	}
	meta := st.body.Response
	msgs := st.body.Messages
	if meta.Lead && len(msgs) > 0 {
		msgs = msgs[1:]
	}
	out := chatMessages(msgs)
	output := r.Output.Tokens()
	if calls, ok := st.calls(output); ok {
		var hc []any
		for _, c := range calls {
			hc = append(hc, map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Function.Name, "arguments": c.Function.Arguments}})
		}
		return append(out, map[string]any{"role": "assistant", "tool_calls": hc}), nil
	}
	return append(out, map[string]any{"role": "assistant", "content": outputText(output)}), nil
}

// outputText is the text of output.
func outputText(output []reqfsm.Token) string {
	var b strings.Builder
	for _, t := range output {
		b.WriteString(t.Text)
	}
	return b.String()
}
