package frontend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"unicode/utf8"

	"github.com/lifeline-llm/lifeline/frontend/openai"
)

// This file reads the OpenAI parameters of /v1/completions and
// /v1/chat/completions into a CompletionRequest. Every parameter OpenAI
// documents is known here: it either works or is refused with a 400 that
// names it; unknown fields are accepted, as OpenAI clients send extras.

// ParamError is a request refused for one parameter (openai.ParamError).
type ParamError = openai.ParamError

// Stable codes of ParamError (and of the worker's refusals, mapped).
const (
	CodeInvalidValue          = openai.CodeInvalidValue
	CodeUnsupportedParameter  = openai.CodeUnsupportedParameter
	CodeMissingRequired       = openai.CodeMissingRequired
	CodeContextLengthExceeded = "context_length_exceeded"
	CodeModelNotFound         = "model_not_found"
	maxStop                   = 4
	maxTokensBound            = 1 << 20
	maxTimeoutMs              = 24 * 3600 * 1000
)

func invalid(param, format string, args ...any) *ParamError {
	return &ParamError{Param: param, Code: CodeInvalidValue, Message: fmt.Sprintf(format, args...)}
}

func unsupported(param, why string) *ParamError {
	return &ParamError{Param: param, Code: CodeUnsupportedParameter, Message: why}
}

// openAIRequest is the body as a client sends it. Polymorphic and numeric
// parameters stay raw: they are parsed here, in the type the engine uses,
// so that nothing wraps around and each error names its parameter.
type openAIRequest struct {
	Model               string            `json:"model"`
	Prompt              json.RawMessage   `json:"prompt"`
	Messages            []openAIMessage   `json:"messages"`
	MaxTokens           *number           `json:"max_tokens"`
	MaxCompletionTokens *number           `json:"max_completion_tokens"`
	Temperature         *number           `json:"temperature"`
	TopP                *number           `json:"top_p"`
	TopK                *number           `json:"top_k"`
	Seed                *number           `json:"seed"`
	Stop                json.RawMessage   `json:"stop"`
	Stream              *bool             `json:"stream"`
	StreamOptions       *openAIStreamOpts `json:"stream_options"`
	FrequencyPenalty    *number           `json:"frequency_penalty"`
	PresencePenalty     *number           `json:"presence_penalty"`
	User                *string           `json:"user"`
	TimeoutMs           *number           `json:"timeout_ms"`
	Priority            *string           `json:"priority"`
	IgnoreEOS           *bool             `json:"ignore_eos"`

	// Read in their own files: logprobs.go, structured.go, tools.go.
	Logprobs          json.RawMessage `json:"logprobs"`
	TopLogprobs       *number         `json:"top_logprobs"`
	Echo              *bool           `json:"echo"`
	ResponseFormat    json.RawMessage `json:"response_format"`
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	Functions         json.RawMessage `json:"functions"`
	FunctionCall      json.RawMessage `json:"function_call"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`

	// Known, and refused unless at their default (refusals).
	N                *number         `json:"n"`
	LogitBias        map[string]any  `json:"logit_bias"`
	BestOf           *number         `json:"best_of"`
	Suffix           *string         `json:"suffix"`
	Prediction       json.RawMessage `json:"prediction"`
	Audio            json.RawMessage `json:"audio"`
	Modalities       []string        `json:"modalities"`
	Store            *bool           `json:"store"`
	ReasoningEffort  *string         `json:"reasoning_effort"`
	WebSearchOptions json.RawMessage `json:"web_search_options"`
	ServiceTier      *string         `json:"service_tier"`
}

type openAIStreamOpts struct {
	IncludeUsage *bool `json:"include_usage"`
	// Resumable (extension) keeps the request running through a client
	// disconnect for the resume window.
	Resumable bool `json:"resumable"`
}

type openAIMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID *string         `json:"tool_call_id"`
}

// refusal is a parameter the engine does not support: set reports whether
// a request sets it to anything but its default. Moving a parameter to
// "works" is deleting its line here (and reading it).
type refusal struct {
	param string
	set   func(*openAIRequest) bool
	why   string
}

var refusals = []refusal{
	// best_of == n is n choices; more candidates than choices is a search.
	{"best_of", bestOfAboveN,
		"beam search / best_of is not supported: the candidate tree cannot be migrated"},
	{"suffix", func(b *openAIRequest) bool { return b.Suffix != nil && *b.Suffix != "" }, "suffix (insertion) is not supported"},
	{"prediction", func(b *openAIRequest) bool { return !rawIs(b.Prediction) }, "predicted outputs are not supported"},
	{"audio", func(b *openAIRequest) bool { return !rawIs(b.Audio) }, "audio output is not supported"},
	{"modalities", func(b *openAIRequest) bool {
		return !(len(b.Modalities) == 0 || len(b.Modalities) == 1 && b.Modalities[0] == "text")
	},
		"only the text modality is supported"},
	{"store", func(b *openAIRequest) bool { return b.Store != nil && *b.Store }, "stored completions are not supported"},
	{"reasoning_effort", func(b *openAIRequest) bool { return b.ReasoningEffort != nil }, "the models served are not reasoning models"},
	{"web_search_options", func(b *openAIRequest) bool { return !rawIs(b.WebSearchOptions) }, "web search is not supported"},
	{"service_tier", func(b *openAIRequest) bool {
		return b.ServiceTier != nil && *b.ServiceTier != "auto" && *b.ServiceTier != "default"
	}, "only the default service tier is served"},
}

// numIs: n is unset, null, or the number def.
func numIs(n *number, def string) bool {
	if n == nil {
		return true
	}
	f, err := n.Float64()
	d, _ := strconv.ParseFloat(def, 64)
	return err == nil && f == d
}

// rawIs: raw is unset, null, or one of defs.
func rawIs(raw json.RawMessage, defs ...string) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return true
	}
	for _, d := range defs {
		if string(raw) == d {
			return true
		}
	}
	return false
}

// parseRequest reads a request body into the admitted form. An error is a
// *ParamError (or a malformed body, a plain 400).
func parseRequest(data []byte, chat bool) (CompletionRequest, error) {
	var b openAIRequest
	var out CompletionRequest
	if !utf8.Valid(data) {
		// encoding/json replaces invalid UTF-8 silently: refuse it here.
		return out, invalid(invalidUTF8Param(data), "the body is not valid UTF-8")
	}
	if err := json.Unmarshal(data, &b); err != nil {
		var te *json.UnmarshalTypeError
		if asType(err, &te) && te.Field != "" {
			return out, invalid(te.Field, "%s must be a %s (got a JSON %s)", te.Field, typeName(te.Type), te.Value)
		}
		return out, fmt.Errorf("malformed JSON: %w", err)
	}
	for _, r := range refusals {
		if r.set(&b) {
			return out, unsupported(r.param, r.why)
		}
	}
	out.Model = b.Model
	if b.Model == "" {
		return out, &ParamError{Param: "model", Code: CodeMissingRequired, Message: "model is required"}
	}
	if err := parsePromptOrMessages(&b, &out, chat); err != nil {
		return out, err
	}
	if err := parseChoices(&b, &out); err != nil {
		return out, err
	}
	if err := parseSampling(&b, &out, chat); err != nil {
		return out, err
	}
	bias, err := parseLogitBias(b.LogitBias)
	if err != nil {
		return out, err
	}
	out.LogitBias = bias
	if b.Stream != nil {
		out.Stream = *b.Stream
	}
	if o := b.StreamOptions; o != nil {
		if !out.Stream && (o.IncludeUsage != nil && *o.IncludeUsage) {
			return out, invalid("stream_options", "stream_options.include_usage needs stream: true")
		}
		out.StreamOptions.Resumable = o.Resumable
		out.StreamOptions.IncludeUsage = o.IncludeUsage != nil && *o.IncludeUsage
	}
	if b.IgnoreEOS != nil {
		out.IgnoreEOS = *b.IgnoreEOS
	}
	if b.Priority != nil {
		out.Priority = *b.Priority
	}
	if b.TimeoutMs != nil {
		ms, err := parseInt("timeout_ms", *b.TimeoutMs, 0, maxTimeoutMs)
		if err != nil {
			return out, err
		}
		out.TimeoutMs = ms
	}
	if err := parseOutputShape(&b, &out, chat); err != nil {
		return out, err
	}
	if out.ToolCalls != nil && out.choiceCount() > 1 {
		// Each choice would need its own call scanner and call ids in
		// the multiplexed stream: not built.
		return out, unsupported("n", "several choices with tools are not supported: ask for one choice per request")
	}
	return out, nil
}

// parseSampling reads the sampling and length parameters.
func parseSampling(b *openAIRequest, out *CompletionRequest, chat bool) error {
	maxTok := b.MaxTokens
	param := "max_tokens"
	if chat && b.MaxCompletionTokens != nil {
		if b.MaxTokens != nil && b.MaxTokens.String() != b.MaxCompletionTokens.String() {
			return invalid("max_completion_tokens", "max_tokens %s and max_completion_tokens %s disagree; set one", b.MaxTokens, b.MaxCompletionTokens)
		}
		maxTok, param = b.MaxCompletionTokens, "max_completion_tokens"
	} else if b.MaxCompletionTokens != nil {
		return unsupported("max_completion_tokens", "max_completion_tokens is a chat parameter; use max_tokens")
	}
	if maxTok != nil {
		n, err := parseInt(param, *maxTok, 1, maxTokensBound)
		if err != nil {
			return err
		}
		v := int(n)
		out.MaxTokens = &v
	}
	for _, f := range []struct {
		param    string
		n        *number
		lo, hi   float64
		openLow  bool
		dst      **float64
		dstPlain *float64
	}{
		{"temperature", b.Temperature, 0, 2, false, &out.Temperature, nil},
		{"top_p", b.TopP, 0, 1, true, &out.TopP, nil},
		{"frequency_penalty", b.FrequencyPenalty, -2, 2, false, nil, &out.FrequencyPenalty},
		{"presence_penalty", b.PresencePenalty, -2, 2, false, nil, &out.PresencePenalty},
	} {
		if f.n == nil {
			continue
		}
		v, err := f.n.Float64()
		if err != nil || math.IsNaN(v) || v < f.lo || v > f.hi || f.openLow && v == f.lo {
			lo := "["
			if f.openLow {
				lo = "("
			}
			return invalid(f.param, "%s is out of range: want a number in %s%g, %g]", f.n, lo, f.lo, f.hi)
		}
		if f.dst != nil {
			*f.dst = &v
		} else {
			*f.dstPlain = v
		}
	}
	if b.TopK != nil {
		k, err := parseInt("top_k", *b.TopK, 0, math.MaxInt32)
		if err != nil {
			return err
		}
		out.TopK = int(k)
	}
	if b.Seed != nil {
		s, err := parseInt("seed", *b.Seed, 0, math.MaxInt64)
		if err != nil {
			return err
		}
		seed := uint64(s)
		out.Seed, out.SeedSet = seed, true
	}
	stop, err := parseStop(b.Stop)
	out.Stop = stop
	return err
}

// parseInt reads an integer in [lo, hi]: no fraction, no wrap-around.
func parseInt(param string, n number, lo, hi int64) (int64, error) {
	v, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil || v < lo || v > hi {
		return 0, invalid(param, "%s is out of range: want an integer in [%d, %d]", n, lo, hi)
	}
	return v, nil
}

// parseStop reads stop: a string or an array of at most 4 non-empty ones.
func parseStop(raw json.RawMessage) ([]string, error) {
	if rawIs(raw) {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, invalid("stop", "a stop sequence must not be empty")
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, invalid("stop", "want a string or an array of strings")
	}
	if len(many) > maxStop {
		return nil, invalid("stop", "%d stop sequences: at most %d", len(many), maxStop)
	}
	for _, s := range many {
		if s == "" {
			return nil, invalid("stop", "a stop sequence must not be empty")
		}
	}
	return many, nil
}

// parsePromptOrMessages reads the prompt (completions) or renders the
// messages (chat).
func parsePromptOrMessages(b *openAIRequest, out *CompletionRequest, chat bool) error {
	if chat {
		if !rawIs(b.Prompt) {
			return unsupported("prompt", "a chat completion takes messages, not prompt")
		}
		if len(b.Messages) == 0 {
			return &ParamError{Param: "messages", Code: CodeMissingRequired, Message: "messages is required and must not be empty"}
		}
		msgs := make([]ChatMessage, len(b.Messages))
		for i, m := range b.Messages {
			msg, err := historyMessage(i, m)
			if err != nil {
				return err
			}
			msgs[i] = msg
		}
		p, err := chatTemplate(msgs)
		if err != nil {
			return err
		}
		out.Messages, out.Prompt = msgs, p
		return nil
	}
	if rawIs(b.Prompt) {
		return &ParamError{Param: "prompt", Code: CodeMissingRequired, Message: "prompt is required"}
	}
	var text string
	if json.Unmarshal(b.Prompt, &text) == nil {
		out.Prompt = text
		return checkPromptText(text)
	}
	var texts []string
	if json.Unmarshal(b.Prompt, &texts) == nil {
		return batchOfTexts(texts, out)
	}
	var ids []int64
	if json.Unmarshal(b.Prompt, &ids) != nil {
		var batch [][]int64
		if json.Unmarshal(b.Prompt, &batch) != nil {
			return invalid("prompt", "want a string, an array of strings, an array of token ids or an array of token-id arrays")
		}
		return batchOfTokens(batch, out)
	}
	toks, err := promptTokens("prompt", ids)
	out.PromptTokens = toks
	return err
}

// promptTokens checks a prompt of token ids: not empty, each an int32.
func promptTokens(param string, ids []int64) ([]int, error) {
	if len(ids) == 0 {
		return nil, invalid(param, "the prompt must not be empty")
	}
	out := make([]int, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return nil, invalid(param, "token id %d is out of range", id)
		}
		out[i] = int(id)
	}
	return out, nil
}

func checkPromptText(s string) error {
	if s == "" {
		return invalid("prompt", "the prompt must not be empty")
	}
	return nil
}

// messageContent is a message's text: a string, or an array of text parts
// (joined). Other parts (images, audio, files) are refused.
func messageContent(i int, m openAIMessage) (string, error) {
	switch {
	case m.Role == "function":
		return "", unsupported(fmt.Sprintf("messages[%d].role", i), "function messages are deprecated and not supported: use tool messages")
	case rawIs(m.Content):
		if m.Role == "assistant" {
			return "", nil
		}
		return "", &ParamError{Param: fmt.Sprintf("messages[%d].content", i), Code: CodeMissingRequired, Message: "content is required"}
	}
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if json.Unmarshal(m.Content, &parts) != nil {
		return "", invalid(fmt.Sprintf("messages[%d].content", i), "want a string or an array of content parts")
	}
	var text bytes.Buffer
	for j, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", unsupported(fmt.Sprintf("messages[%d].content[%d].type", i, j), fmt.Sprintf("content part %q is not supported: text only", p.Type))
		}
		text.WriteString(*p.Text)
	}
	return text.String(), nil
}

// invalidUTF8Param names the top-level field holding invalid UTF-8 ("" if
// the body is not an object).
func invalidUTF8Param(data []byte) string {
	var fields map[string]json.RawMessage
	if json.Unmarshal(data, &fields) != nil {
		return ""
	}
	for k, v := range fields {
		if !utf8.Valid(v) {
			return k
		}
	}
	return ""
}

// number is a JSON number and nothing else. encoding/json's Number also
// takes a string that holds one ("10"); OpenAI's API refuses that, and so
// do we, naming the parameter.
type number string

func (n number) String() string { return string(n) }

func (n number) Float64() (float64, error) { return strconv.ParseFloat(string(n), 64) }

func (n *number) UnmarshalJSON(b []byte) error {
	// The decoder has checked b is one JSON value; null never gets here
	// (a *number stays nil).
	if len(b) == 0 || b[0] != '-' && (b[0] < '0' || b[0] > '9') {
		return &json.UnmarshalTypeError{Value: jsonKind(b), Type: reflect.TypeFor[number]()}
	}
	*n = number(b)
	return nil
}

// jsonKind names the kind of the JSON value b, as a type error reports it.
func jsonKind(b []byte) string {
	switch {
	case len(b) == 0:
		return "nothing"
	case b[0] == '"':
		return "string"
	case b[0] == '{':
		return "object"
	case b[0] == '[':
		return "array"
	case b[0] == 't' || b[0] == 'f':
		return "bool"
	default:
		return "number"
	}
}

// typeName is a Go type as the JSON a client must send for it.
func typeName(t reflect.Type) string {
	if t == reflect.TypeFor[number]() {
		return "number"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "boolean"
	case reflect.String:
		return "string"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	default:
		return "number"
	}
}

func asType(err error, target **json.UnmarshalTypeError) bool {
	te, ok := err.(*json.UnmarshalTypeError)
	if ok {
		*target = te
	}
	return ok
}

// maxLogitBiasEntries bounds logit_bias (OpenAI's own limit is 300).
const maxLogitBiasEntries = 1024

// parseLogitBias reads logit_bias: token ids (decimal strings) to biases
// in [-100, 100], added to those tokens' logits before sampling. Ids past
// the model's vocabulary are refused by the worker.
func parseLogitBias(m map[string]any) (map[int]float64, error) {
	if len(m) == 0 {
		return nil, nil
	}
	if len(m) > maxLogitBiasEntries {
		return nil, invalid("logit_bias", "%d entries: at most %d", len(m), maxLogitBiasEntries)
	}
	out := make(map[int]float64, len(m))
	for k, v := range m {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 {
			return nil, invalid("logit_bias", "key %q is not a token id", k)
		}
		b, ok := v.(float64)
		if !ok || math.IsNaN(b) || b < -100 || b > 100 {
			return nil, invalid("logit_bias", "token %s: bias %v: want a number in [-100, 100]", k, v)
		}
		out[int(id)] = b
	}
	return out, nil
}
