package frontend

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/route"
)

// CompletionRequest is a request as admitted: what parseRequest read from
// the OpenAI body, with the seed fixed. It is also the body of the
// request record (JSON), from which a takeover runs the request again.
type CompletionRequest struct {
	Model  string `json:"model"`
	Prompt string `json:"prompt"`
	// PromptTokens, when set, is the prompt as token ids (without BOS),
	// used instead of Prompt.
	PromptTokens []int    `json:"prompt_tokens,omitempty"`
	MaxTokens    *int     `json:"max_tokens"`
	Temperature  *float64 `json:"temperature"`
	TopP         *float64 `json:"top_p"`
	TopK         int      `json:"top_k"`
	Seed         uint64   `json:"seed"`
	// SeedSet: the client named the seed (otherwise one is drawn at
	// admission, and stored in Seed).
	SeedSet bool `json:"-"`
	// SeedDrawn: Seed was drawn at admission; responses report it (the
	// lifeline object's seed), as the client cannot know it otherwise.
	SeedDrawn bool     `json:"seed_drawn,omitempty"`
	Stop      []string `json:"stop"`
	Stream    bool     `json:"stream"`
	// IgnoreEOS is an extension for benchmarks and tests.
	IgnoreEOS bool `json:"ignore_eos"`
	// TimeoutMs (extension; also the Lifeline-Timeout-Ms header) is the
	// request's deadline from its arrival: past it the request ends with
	// a typed deadline_exceeded error (504 before anything is streamed),
	// and a migration that cannot finish before it is not tried.
	TimeoutMs int64 `json:"timeout_ms"`
	// Priority (extension; also the Lifeline-Priority header) is
	// interactive ("": the default) or batch.
	Priority      string `json:"priority,omitempty"`
	StreamOptions struct {
		// Resumable keeps the request running through a client disconnect
		// for the resume window.
		Resumable bool `json:"resumable"`
		// IncludeUsage ends the stream with a chunk carrying the usage
		// and no choices.
		IncludeUsage bool `json:"include_usage,omitempty"`
	} `json:"stream_options"`
	FrequencyPenalty float64 `json:"frequency_penalty"`
	PresencePenalty  float64 `json:"presence_penalty"`
	// LogitBias adds its value to the logit of each token id it names.
	LogitBias map[int]float64 `json:"logit_bias,omitempty"`
	// Messages is the chat form (POST /v1/chat/completions), rendered
	// into Prompt.
	Messages []ChatMessage `json:"messages"`
	// Structured constrains the output to a grammar (response_format, or
	// the tools' calls); nil: free text.
	Structured *StructuredOutput `json:"structured,omitempty"`
	// Logprobs asks for every token's log-probability, TopLogprobs for
	// that many alternatives (chat: top_logprobs; completions: logprobs).
	Logprobs    bool `json:"logprobs,omitempty"`
	TopLogprobs int  `json:"top_logprobs,omitempty"`
	// Echo (completions) puts the prompt before the output.
	Echo bool `json:"echo,omitempty"`
	// Tools are the functions a chat request may call; ToolCalls how the
	// output is read (tools.go).
	Tools     []Tool     `json:"tools,omitempty"`
	ToolCalls *ToolCalls `json:"tool_calls,omitempty"`
	// N (choices per prompt) and Batch (a prompt array of k > 1, Batch[0]
	// also in Prompt / PromptTokens) ask for several choices; Choice
	// places one of them, a request of its own, in its parent
	// (choices.go).
	N      int           `json:"n,omitempty"`
	Batch  []BatchPrompt `json:"batch,omitempty"`
	Choice *ChoiceOf     `json:"choice,omitempty"`
	// Response is set for a request of the Responses API
	// (responses_body.go).
	Response *responseMeta `json:"response,omitempty"`
	// tokenized is Prompt encoded by the admission check (nil: not).
	tokenized *tokenizedPrompt
}

// ChatMessage is one message of a chat completion request.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// ToolCalls are an assistant message's calls; ToolCallID the call a
	// tool message answers.
	ToolCalls  []HistoryCall `json:"tool_calls,omitempty"`
	ToolCallID string        `json:"tool_call_id,omitempty"`
}

// recorded: the request has a record (when the frontend writes them),
// so that any frontend can resume, replay or retrieve it: a streamed
// request, and a stored response (streamed or not).
func (b *CompletionRequest) recorded() bool {
	if b.Response != nil {
		return b.Response.Store // store: false keeps nothing
	}
	return b.Stream
}

// DefaultMaxTokens is a request's max_tokens when it names none.
const DefaultMaxTokens = 16

// maxTokens is the request's output bound.
func (b *CompletionRequest) maxTokens() int {
	if b.MaxTokens != nil {
		return *b.MaxTokens
	}
	return DefaultMaxTokens
}

// promptEstimate is the prompt's length in tokens for the deadline
// check: exact for token ids, estimated from the bytes of a text.
func (b *CompletionRequest) promptEstimate() int {
	if len(b.PromptTokens) > 0 {
		return len(b.PromptTokens) + 1
	}
	return len(b.Prompt)/4 + 1
}

// chatTemplate renders messages for the reference model, which has no chat
// tokens of its own: "role: content" lines, then the assistant's turn. A
// developer message is the newer name of a system message.
func chatTemplate(msgs []ChatMessage) (string, error) {
	var b strings.Builder
	for i, m := range msgs {
		role := m.Role
		switch role {
		case "system", "user", "assistant":
		case "developer":
			role = "system"
		case "tool":
			role = "tool " + m.ToolCallID
		default:
			return "", invalid(fmt.Sprintf("messages[%d].role", i), "%q: want system, developer, user, assistant or tool", m.Role)
		}
		b.WriteString(role)
		b.WriteString(": ")
		b.WriteString(m.Content)
		b.WriteString(renderHistoryCalls(m.ToolCalls))
		b.WriteString("\n")
	}
	b.WriteString("assistant:")
	return b.String(), nil
}

// wireMessages is a chat request's conversation for a worker that
// renders it with its model's own template: roles as chatTemplate reads
// them, an assistant's calls written after its text, the tools' line as
// a system message first. Nil for a completion.
func wireMessages(b CompletionRequest) []*wire.ChatMessage {
	if len(b.Messages) == 0 {
		return nil
	}
	var out []*wire.ChatMessage
	if len(b.Tools) > 0 {
		out = append(out, &wire.ChatMessage{Role: "system", Content: strings.TrimSuffix(renderToolsPrompt(b.Tools), "\n")})
	}
	for _, m := range b.Messages {
		role := m.Role
		if role == "developer" {
			role = "system"
		}
		out = append(out, &wire.ChatMessage{Role: role, Content: m.Content + renderHistoryCalls(m.ToolCalls)})
	}
	return out
}

// decodeCompletion reads a completion (or, with chat, a chat completion)
// request: its body data and the Lifeline-Timeout-Ms header. An error is a
// 400: a *ParamError, or a malformed body.
func decodeCompletion(data []byte, req *http.Request, chat bool) (CompletionRequest, error) {
	body, err := parseRequest(data, chat)
	if err != nil {
		return body, err
	}
	if h := req.Header.Get("Lifeline-Timeout-Ms"); h != "" && body.TimeoutMs == 0 {
		ms, err := parseInt("Lifeline-Timeout-Ms", number(h), 0, maxTimeoutMs)
		if err != nil {
			return body, err
		}
		body.TimeoutMs = ms
	}
	if h := req.Header.Get("Lifeline-Priority"); h != "" && body.Priority == "" {
		body.Priority = h
	}
	return body, body.validate()
}

// validate checks the fields every request needs (a request record's body
// too); an error is the message of a 400. Whether the model is served is
// the server's to say.
func (b *CompletionRequest) validate() error {
	switch maxTokens := b.maxTokens(); {
	case b.Model == "":
		return &ParamError{Param: "model", Code: CodeMissingRequired, Message: "model is required"}
	case maxTokens <= 0 || maxTokens > maxTokensBound:
		return invalid("max_tokens", "%d is out of range: want an integer in [1, %d]", maxTokens, maxTokensBound)
	case b.Prompt == "" && len(b.PromptTokens) == 0:
		return invalid("prompt", "the prompt must not be empty")
	case b.Priority != "" && b.Priority != route.PriorityInteractive && b.Priority != route.PriorityBatch:
		return invalid("priority", "%q: want interactive or batch", b.Priority)
	case b.TimeoutMs < 0 || b.TimeoutMs > maxTimeoutMs:
		return invalid("timeout_ms", "%d: want 0 for none, at most a day", b.TimeoutMs)
	}
	return nil
}

// resumable reports whether the request asked to survive its client's
// disconnect, in its body or with the Lifeline-Resumable header.
func resumable(body CompletionRequest, req *http.Request) bool {
	return body.StreamOptions.Resumable || req.Header.Get("Lifeline-Resumable") == "1"
}

func writeRequestError(w http.ResponseWriter, e *reqfsm.RequestError) {
	writeRequestErrorFor(w, e, nil)
}

// writeRequestErrorFor answers a request that ended before streaming
// anything; body (nil: unknown) names the parameter a worker's refusal is
// about where the worker's field is not the client's.
func writeRequestErrorFor(w http.ResponseWriter, e *reqfsm.RequestError, body *CompletionRequest) {
	code := http.StatusInternalServerError
	switch e.Type {
	case openai.ErrNoCapacity, openai.ErrMigrationExhausted, openai.ErrFrontendStopping, openai.ErrTakeoverUnavailable, openai.ErrDraining:
		code = http.StatusServiceUnavailable
	case openai.ErrOverloaded, openai.ErrRetryBudget:
		code = http.StatusTooManyRequests
	case openai.ErrInvalidRequest:
		// The worker refused the request (its context, its vocabulary):
		// the same 400 as the frontend's own validation.
		pe := workerParamError(e.Message)
		if body != nil {
			pe = structuredParamError(body, pe)
		}
		writeParamError(w, pe)
		return
	case openai.ErrDeadlineExceeded:
		code = http.StatusGatewayTimeout
	case openai.ErrCancelledType:
		code = 499
	case openai.ErrTakenOver:
		code = http.StatusConflict
	}
	writeError(w, code, e.Type, e.Message)
}

// workerRefusal is the prefix of a worker's INVALID_REQUEST message,
// "decode: invalid request: FIELD: REASON".
const workerRefusal = "decode: invalid request: "

// workerParamError maps a worker's refusal to the parameter it names, in
// a plain sentence: the engine's package prefix is not the client's
// business.
func workerParamError(msg string) *ParamError {
	msg = strings.TrimPrefix(msg, workerRefusal)
	e := &ParamError{Code: CodeInvalidValue, Message: msg}
	if field, reason, ok := strings.Cut(msg, ": "); ok && !strings.Contains(field, " ") {
		e.Param, e.Message = field, reason
	}
	if e.Param == "prefix_tokens" || e.Param == "sampling" {
		e.Param = "" // the frontend's, or several parameters together
	}
	if strings.Contains(e.Message, "the context of") {
		e.Code = CodeContextLengthExceeded
	}
	return e
}

// writeParamError answers a request refused for a parameter: a 400.
func writeParamError(w http.ResponseWriter, e *ParamError) {
	writeErrorBody(w, http.StatusBadRequest, openai.ErrInvalidRequest, e.Code, e.Param, e.Message)
}

// writeBadRequest answers a request decodeCompletion refused.
func writeBadRequest(w http.ResponseWriter, err error) {
	var pe *ParamError
	if errors.As(err, &pe) {
		writeParamError(w, pe)
		return
	}
	writeErrorBody(w, http.StatusBadRequest, openai.ErrInvalidRequest, CodeInvalidValue, "", err.Error())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// retryAfter is the Retry-After of the retryable refusals, in seconds:
// an instance at its limit frees up soon; a model with no routable
// instance has waited for one already.
var retryAfter = map[openai.ErrorType]string{openai.ErrOverloaded: "1", openai.ErrRetryBudget: "1", openai.ErrNoCapacity: "2", openai.ErrFrontendStopping: "1", openai.ErrTakeoverUnavailable: "1", openai.ErrDraining: "2"}

// writeError writes the OpenAI error shape with a stable type, which is
// also its code; no parameter.
func writeError(w http.ResponseWriter, code int, typ openai.ErrorType, msg string) {
	writeErrorBody(w, code, typ, string(typ), "", msg)
}

// writeErrorBody writes {"error": {"message", "type", "param", "code"}};
// param is null when empty.
func writeErrorBody(w http.ResponseWriter, status int, typ openai.ErrorType, code, param, msg string) {
	if s, ok := retryAfter[typ]; ok {
		w.Header().Set("Retry-After", s)
	}
	var p any
	if param != "" {
		p = param
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": p, "code": code}})
}
