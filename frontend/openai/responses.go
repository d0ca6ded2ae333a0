package openai

import "encoding/json"

// This file holds the Responses API's objects as the official SDKs parse
// them: the response, its output items and content parts, its usage, and
// the streamed events.

// Response statuses.
const (
	StatusQueued     = "queued"
	StatusInProgress = "in_progress"
	StatusCompleted  = "completed"
	StatusIncomplete = "incomplete"
	StatusFailed     = "failed"
	StatusCancelled  = "cancelled"
)

// Response is the response object of POST /v1/responses and GET
// /v1/responses/{id}. The request's parameters are echoed as given
// (Tools, ToolChoice, Text: raw JSON).
type Response struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"` // "response"
	CreatedAt          int64              `json:"created_at"`
	Status             string             `json:"status"`
	Background         bool               `json:"background"`
	Error              *ResponseError     `json:"error"`
	IncompleteDetails  *IncompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	MaxOutputTokens    *int               `json:"max_output_tokens"`
	Metadata           map[string]string  `json:"metadata"`
	Model              string             `json:"model"`
	Output             []OutputItem       `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Store              bool               `json:"store"`
	Temperature        *float64           `json:"temperature"`
	TopP               *float64           `json:"top_p"`
	Text               json.RawMessage    `json:"text"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              json.RawMessage    `json:"tools"`
	Truncation         string             `json:"truncation"`
	Usage              *ResponseUsage     `json:"usage"`
	// Seed (extension) is the seed the response was sampled with: the
	// client's, or the one drawn at admission.
	Seed uint64 `json:"seed"`
}

// ResponseError is a failed (or cancelled) response's error.
type ResponseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// IncompleteDetails says why a response is incomplete.
type IncompleteDetails struct {
	Reason string `json:"reason"` // max_output_tokens
}

// ResponseUsage counts a response's tokens.
type ResponseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// NewUsage is the usage of input and output tokens.
func NewUsage(input, output int) *ResponseUsage {
	return &ResponseUsage{InputTokens: input, OutputTokens: output, TotalTokens: input + output}
}

// Item types.
const (
	ItemMessage            = "message"
	ItemFunctionCall       = "function_call"
	ItemFunctionCallOutput = "function_call_output"
)

// OutputItem is an item of a response's output or input: a message (Role,
// Content), a function call (CallID, Name, Arguments) or, as input, a
// function call's output (CallID, Output).
type OutputItem struct {
	ID        string
	Type      string
	Status    string
	Role      string
	Content   []ContentPart
	CallID    string
	Name      string
	Arguments string
	Output    string
}

// outputItemJSON is every field an item may have, for reading one.
type outputItemJSON struct {
	ID        string        `json:"id"`
	Type      string        `json:"type"`
	Status    string        `json:"status"`
	Role      string        `json:"role"`
	Content   []ContentPart `json:"content"`
	CallID    string        `json:"call_id"`
	Name      string        `json:"name"`
	Arguments string        `json:"arguments"`
	Output    string        `json:"output"`
}

// UnmarshalJSON reads what MarshalJSON writes.
func (it *OutputItem) UnmarshalJSON(b []byte) error {
	var j outputItemJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*it = OutputItem(j)
	return nil
}

// MarshalJSON writes the fields of the item's type only, as the API does.
func (it OutputItem) MarshalJSON() ([]byte, error) {
	switch it.Type {
	case ItemFunctionCall:
		return json.Marshal(struct {
			ID        string `json:"id"`
			Type      string `json:"type"`
			Status    string `json:"status"`
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		}{it.ID, it.Type, it.Status, it.CallID, it.Name, it.Arguments})
	case ItemFunctionCallOutput:
		return json.Marshal(struct {
			ID     string `json:"id"`
			Type   string `json:"type"`
			Status string `json:"status"`
			CallID string `json:"call_id"`
			Output string `json:"output"`
		}{it.ID, it.Type, it.Status, it.CallID, it.Output})
	}
	content := it.Content
	if content == nil {
		content = []ContentPart{}
	}
	return json.Marshal(struct {
		ID      string        `json:"id"`
		Type    string        `json:"type"`
		Status  string        `json:"status"`
		Role    string        `json:"role"`
		Content []ContentPart `json:"content"`
	}{it.ID, it.Type, it.Status, it.Role, content})
}

// Content part types.
const (
	PartInputText  = "input_text"
	PartOutputText = "output_text"
)

// ContentPart is a part of a message's content: input_text, or
// output_text (with its annotations and logprobs, always empty here).
type ContentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// MarshalJSON writes an output_text's empty annotations and logprobs.
func (p ContentPart) MarshalJSON() ([]byte, error) {
	if p.Type != PartOutputText {
		return json.Marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{p.Type, p.Text})
	}
	return json.Marshal(struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Annotations []any  `json:"annotations"`
		Logprobs    []any  `json:"logprobs"`
	}{p.Type, p.Text, []any{}, []any{}})
}

// Event types of a streamed response.
const (
	EventCreated            = "response.created"
	EventInProgress         = "response.in_progress"
	EventOutputItemAdded    = "response.output_item.added"
	EventOutputItemDone     = "response.output_item.done"
	EventContentPartAdded   = "response.content_part.added"
	EventContentPartDone    = "response.content_part.done"
	EventOutputTextDelta    = "response.output_text.delta"
	EventOutputTextDone     = "response.output_text.done"
	EventArgumentsDelta     = "response.function_call_arguments.delta"
	EventArgumentsDone      = "response.function_call_arguments.done"
	EventCompleted          = "response.completed"
	EventIncomplete         = "response.incomplete"
	EventFailed             = "response.failed"
	EventError              = "error"
	ResponseObject          = "response"
	ResponseDeletedObject   = "response.deleted"
	ResponseInputItemsLists = "list"
)

// Event is one event of a streamed response; Type says which fields are
// set. SequenceNumber counts the response's events from 0, contiguous:
// a client resumes after the last it saw (starting_after).
type Event struct {
	Type           string       `json:"type"`
	SequenceNumber int          `json:"sequence_number"`
	Response       *Response    `json:"response,omitempty"`
	OutputIndex    *int         `json:"output_index,omitempty"`
	ContentIndex   *int         `json:"content_index,omitempty"`
	ItemID         string       `json:"item_id,omitempty"`
	Item           *OutputItem  `json:"item,omitempty"`
	Part           *ContentPart `json:"part,omitempty"`
	Delta          *string      `json:"delta,omitempty"`
	Text           *string      `json:"text,omitempty"`
	Arguments      *string      `json:"arguments,omitempty"`
	Name           string       `json:"name,omitempty"`
	Logprobs       *[]any       `json:"logprobs,omitempty"`
}

// ErrorEvent is the `error` event: not one of the response's events (it
// has no sequence number of its own), it ends a stream that goes on
// elsewhere (Code taken_over or frontend_stopping: resume there with
// starting_after) or that cannot be served.
type ErrorEvent struct {
	Type    string  `json:"type"` // "error"
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	// OwnerURL (extension) is where a taken-over response goes on.
	OwnerURL string `json:"owner_url,omitempty"`
}
