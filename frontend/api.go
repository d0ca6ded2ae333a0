package frontend

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// CompletionRequest is the body of POST /v1/completions. Unknown fields are
// ignored, as OpenAI clients expect.
type CompletionRequest struct {
	Model       string   `json:"model"`
	Prompt      string   `json:"prompt"`
	MaxTokens   *int     `json:"max_tokens"`
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	TopK        int      `json:"top_k"`
	Seed        uint64   `json:"seed"`
	Stop        []string `json:"stop"`
	Stream      bool     `json:"stream"`
	// IgnoreEOS is an extension for benchmarks and tests.
	IgnoreEOS bool `json:"ignore_eos"`
	// TimeoutMs (extension; also the Lifeline-Timeout-Ms header) is the
	// request's deadline from its arrival: past it the request ends with
	// a typed deadline_exceeded error (504 before anything is streamed),
	// and a migration that cannot finish before it is not tried.
	TimeoutMs     int64 `json:"timeout_ms"`
	StreamOptions struct {
		// Resumable keeps the request running through a client disconnect
		// for the resume window.
		Resumable bool `json:"resumable"`
	} `json:"stream_options"`
	FrequencyPenalty float64 `json:"frequency_penalty"`
	PresencePenalty  float64 `json:"presence_penalty"`
	// Messages is the chat form (POST /v1/chat/completions).
	Messages []ChatMessage `json:"messages"`
}

// ChatMessage is one message of a chat completion request.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
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

// chatTemplate renders messages for the reference model, which has no chat
// tokens of its own: "role: content" lines, then the assistant's turn.
func chatTemplate(msgs []ChatMessage) (string, error) {
	var b strings.Builder
	for i, m := range msgs {
		switch m.Role {
		case "system", "user", "assistant":
		default:
			return "", fmt.Errorf("messages[%d].role: %q (system, user or assistant)", i, m.Role)
		}
		b.WriteString(m.Role)
		b.WriteString(": ")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	b.WriteString("assistant:")
	return b.String(), nil
}

// decodeCompletion reads a completion (or, with chat, a chat completion)
// request: its body, the Lifeline-Timeout-Ms header, and the chat
// messages rendered as the prompt. An error is the message of a 400.
func decodeCompletion(req *http.Request, chat bool) (CompletionRequest, error) {
	var body CompletionRequest
	dec := json.NewDecoder(io.LimitReader(req.Body, 1<<20))
	if err := dec.Decode(&body); err != nil {
		return body, fmt.Errorf("malformed JSON: %w", err)
	}
	if h := req.Header.Get("Lifeline-Timeout-Ms"); h != "" && body.TimeoutMs == 0 {
		ms, err := strconv.ParseInt(h, 10, 64)
		if err != nil {
			return body, fmt.Errorf("Lifeline-Timeout-Ms: %w", err)
		}
		body.TimeoutMs = ms
	}
	if chat {
		if len(body.Messages) == 0 {
			return body, errors.New("messages: empty")
		}
		p, err := chatTemplate(body.Messages)
		if err != nil {
			return body, err
		}
		body.Prompt = p
	}
	return body, body.validate()
}

// validate checks the fields every request needs; an error is the
// message of a 400. Whether the model is served is the server's to say.
func (b *CompletionRequest) validate() error {
	switch maxTokens := b.maxTokens(); {
	case b.Model == "":
		return errors.New("model: required")
	case maxTokens <= 0 || maxTokens > 1<<20:
		return fmt.Errorf("max_tokens: %d", maxTokens)
	case b.Prompt == "":
		return errors.New("prompt: empty")
	case b.TimeoutMs < 0 || b.TimeoutMs > 24*3600*1000:
		return fmt.Errorf("timeout_ms: %d (0 for none, at most a day)", b.TimeoutMs)
	}
	return nil
}

// resumable reports whether the request asked to survive its client's
// disconnect, in its body or with the Lifeline-Resumable header.
func resumable(body CompletionRequest, req *http.Request) bool {
	return body.StreamOptions.Resumable || req.Header.Get("Lifeline-Resumable") == "1"
}

// ErrDraining ends a request whose node drains when no other instance
// serves its model: the node is going away, the client may retry (503,
// Retry-After) once it or another is back.
const ErrDraining ErrorType = "draining"

func writeRequestError(w http.ResponseWriter, e *RequestError) {
	code := http.StatusInternalServerError
	switch e.Type {
	case ErrNoCapacity, ErrMigrationExhausted, ErrFrontendStopping, ErrTakeoverUnavailable, ErrDraining:
		code = http.StatusServiceUnavailable
	case ErrOverloaded:
		code = http.StatusTooManyRequests
	case ErrInvalidRequest:
		code = http.StatusBadRequest
	case ErrDeadlineExceeded:
		code = http.StatusGatewayTimeout
	case ErrCancelledType:
		code = 499
	case ErrTakenOver:
		code = http.StatusConflict
	}
	writeError(w, code, e.Type, e.Message)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// retryAfter is the Retry-After of the retryable refusals, in seconds:
// an instance at its limit frees up soon; a model with no routable
// instance has waited for one already.
var retryAfter = map[ErrorType]string{ErrOverloaded: "1", ErrNoCapacity: "2", ErrFrontendStopping: "1", ErrTakeoverUnavailable: "1", ErrDraining: "2"}

// writeError writes the OpenAI error shape with a stable type.
func writeError(w http.ResponseWriter, code int, typ ErrorType, msg string) {
	if s, ok := retryAfter[typ]; ok {
		w.Header().Set("Retry-After", s)
	}
	writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": typ}})
}
