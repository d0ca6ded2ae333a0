// Package sse is the wire format of a Lifeline frontend's streamed
// completions: the chunk every event carries, a writer that encodes a
// stream the way the frontend sends it, and a reader that parses one back.
// It depends on the standard library only, so that clients, benchmarks and
// tests read streams without linking the frontend.
//
// A stream is a comment (a keepalive), then one event per token whose id
// is the token's sequence number (what Last-Event-ID resumes after), then
// either an end chunk (no id, the finish reason and the request's summary)
// or an error event, then the data [DONE]. A stream of several choices
// interleaves them, one choice per chunk, and its event ids hold one
// position per choice (FormatPositions).
package sse

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
)

// Done is the data of the event that ends a stream.
const Done = "[DONE]"

// Chunk is one streamed piece of a completion, in the OpenAI completion
// or chat shape, with Lifeline's own object.
type Chunk struct {
	ID     string `json:"id"`
	Object string `json:"object"` // "text_completion" or "chat.completion.chunk"
	// Created is the request's admission, in unix seconds.
	Created int64  `json:"created,omitempty"`
	Model   string `json:"model"`
	// SystemFingerprint names the numerics of the instance that serves
	// the request (its numerics id and model revision).
	SystemFingerprint string `json:"system_fingerprint,omitempty"`
	// Choices is one choice, OpenAI's streaming shape: a stream of
	// several choices names each chunk's in Index. (The usage chunk,
	// written by WriteUsage, has none.)
	Choices [1]Choice `json:"choices"`
	// Usage is set on the usage chunk only (stream_options.include_usage).
	Usage    *Usage   `json:"usage,omitempty"`
	Lifeline Lifeline `json:"lifeline"`
}

// Usage counts a request's tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Choice is a chunk's text (completions) or delta (chat).
type Choice struct {
	Index int     `json:"index"`
	Text  *string `json:"text,omitempty"`  // completions
	Delta *Delta  `json:"delta,omitempty"` // chat
	// Logprobs is set when the request asked for them: the chat shape
	// (Content) or the completions' legacy shape (Tokens...).
	Logprobs     *Logprobs `json:"logprobs,omitempty"`
	FinishReason *string   `json:"finish_reason"` // null until the end chunk
}

// Delta is a chat chunk's piece of the assistant's message.
type Delta struct {
	// Role is "assistant" in a chat stream's first delta.
	Role    string `json:"role,omitempty"`
	Content string `json:"content,omitempty"`
	// ToolCalls are whole calls: a call is sent once, complete, in one
	// chunk (never as argument fragments), so a resumed stream either has
	// it or not.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is one function call of a chat completion. ID is a pure
// function of the request id and the call's index: a migrated or taken
// over request delivers the same call under the same id.
type ToolCall struct {
	// Index is the call's position in the message (streamed deltas only).
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id"`
	Type     string       `json:"type"` // "function"
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and holds its arguments as JSON text.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Logprobs are the log-probabilities of a chunk's tokens: Content in the
// chat shape; Tokens, TokenLogprobs, TopLogprobs and TextOffset in the
// legacy completions shape.
type Logprobs struct {
	Content []TokenLogprob `json:"content,omitempty"`

	Tokens        []string             `json:"tokens,omitempty"`
	TokenLogprobs []float64            `json:"token_logprobs,omitempty"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs,omitempty"`
	TextOffset    []int                `json:"text_offset,omitempty"`
}

// TokenLogprob is one token's log-probability in the chat shape, with
// its most likely alternatives (most likely first).
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// TopLogprob is one alternative at a position.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// Content is the chunk's text in either shape.
func (c *Chunk) Content() string {
	switch ch := c.Choices[0]; {
	case ch.Text != nil:
		return *ch.Text
	case ch.Delta != nil:
		return ch.Delta.Content
	}
	return ""
}

// Finish is the chunk's finish reason ("" until the end chunk).
func (c *Chunk) Finish() string {
	if f := c.Choices[0].FinishReason; f != nil {
		return *f
	}
	return ""
}

// Lifeline is a chunk's "lifeline" object. A token's chunk carries the
// token fields (SequenceNo ≥ 1); the end chunk carries the summary fields
// instead (SequenceNo 0). Each shape is encoded with exactly its own
// fields, zero or not, as clients may test for a field's presence.
type Lifeline struct {
	RequestID string `json:"request_id"`

	// A token's chunk.
	SequenceNo int    `json:"sequence_no"`
	TokenID    int    `json:"token_id"`
	InstanceID string `json:"instance_id"`

	// The end chunk: how many times the request moved to another worker,
	// and how much of its KV was reused instead of computed.
	Migrations        int `json:"migrations"`
	KVReusedPositions int `json:"kv_reused_positions"`
	// PD is the prefill/decode hand-off's path ("" when the request was
	// not split); only then are the transfer's bytes and the hand-off's
	// timeline (milliseconds by step: prefill, transfer,
	// decode_first_token) sent.
	PD              string             `json:"pd"`
	KVTransferBytes uint64             `json:"kv_transfer_bytes"`
	PDTimelineMs    map[string]float64 `json:"pd_timeline_ms"`
	// LastMigration is the timeline of the request's last migration (unix
	// nanoseconds by step: failure_seen, routed, dispatched, first_token),
	// nil when it never moved.
	LastMigration map[string]int64 `json:"last_migration"`
	// Seed is the request's sampling seed (the end chunk): the client's,
	// or the one drawn at admission, which reproduces the output.
	Seed *uint64 `json:"seed,omitempty"`
	// ToolCalls (the end chunk) are the ids of the tool calls the request
	// delivered, in order: also kept in the request record.
	ToolCalls []string `json:"tool_calls,omitempty"`
	// Continuation (the end chunk of a migrated request) is the
	// guarantee its continuation kept: "bit-exact", "token-exact",
	// "inexact", or "prefix" (another numerics continued the committed
	// tokens).
	Continuation string `json:"continuation,omitempty"`
}

// The encoded shapes of Lifeline, in the order the frontend sends their
// fields.
type (
	tokenLifeline struct {
		RequestID  string `json:"request_id"`
		SequenceNo int    `json:"sequence_no"`
		TokenID    int    `json:"token_id"`
		InstanceID string `json:"instance_id"`
	}
	endLifeline struct {
		RequestID         string           `json:"request_id"`
		Migrations        int              `json:"migrations"`
		KVReusedPositions int              `json:"kv_reused_positions"`
		LastMigration     map[string]int64 `json:"last_migration,omitempty"`
		Seed              *uint64          `json:"seed,omitempty"`
		ToolCalls         []string         `json:"tool_calls,omitempty"`
		Continuation      string           `json:"continuation,omitempty"`
	}
	pdLifeline struct {
		endLifeline
		PD              string             `json:"pd"`
		KVTransferBytes uint64             `json:"kv_transfer_bytes"`
		PDTimelineMs    map[string]float64 `json:"pd_timeline_ms"`
	}
)

// MarshalJSON encodes the token shape or the end shape.
func (l Lifeline) MarshalJSON() ([]byte, error) {
	if l.SequenceNo > 0 {
		return json.Marshal(tokenLifeline{RequestID: l.RequestID, SequenceNo: l.SequenceNo, TokenID: l.TokenID, InstanceID: l.InstanceID})
	}
	end := endLifeline{RequestID: l.RequestID, Migrations: l.Migrations, KVReusedPositions: l.KVReusedPositions, LastMigration: l.LastMigration, Seed: l.Seed,
		ToolCalls: l.ToolCalls, Continuation: l.Continuation}
	if l.PD == "" {
		return json.Marshal(end)
	}
	return json.Marshal(pdLifeline{endLifeline: end, PD: l.PD, KVTransferBytes: l.KVTransferBytes, PDTimelineMs: l.PDTimelineMs})
}

// Error is the object of the event that ends a failed stream: the
// frontend's typed error (OpenAI shape).
type Error struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	// OwnerURL names the frontend that took the request over (type
	// taken_over): the client resumes there.
	OwnerURL string `json:"owner_url,omitempty"`
}

func (e *Error) Error() string { return e.Type + ": " + e.Message }

// errorEvent is the data of an error event.
type errorEvent struct {
	Error Error `json:"error"`
}

// Writer encodes a stream's events onto w, one Write per event. Flushing
// is the caller's.
type Writer struct {
	w   io.Writer
	buf bytes.Buffer
	enc *json.Encoder
}

// NewWriter returns a writer of events onto w.
func NewWriter(w io.Writer) *Writer {
	sw := &Writer{w: w}
	sw.enc = json.NewEncoder(&sw.buf)
	return sw
}

// WriteComment writes a comment, which readers skip: a keepalive, or the
// first bytes that put a stream's headers on the wire.
func (w *Writer) WriteComment(text string) error {
	w.buf.Reset()
	w.buf.WriteString(": ")
	w.buf.WriteString(text)
	w.buf.WriteString("\n\n")
	return w.flush()
}

// WriteChunk writes c as one event; a token's chunk has its sequence
// number as the event's id.
func (w *Writer) WriteChunk(c *Chunk) error {
	w.buf.Reset()
	if seq := c.Lifeline.SequenceNo; seq > 0 {
		w.buf.WriteString("id: ")
		w.buf.WriteString(strconv.Itoa(seq))
		w.buf.WriteByte('\n')
	}
	w.buf.WriteString("data: ")
	if b, ok := appendTokenChunk(w.buf.AvailableBuffer(), c); ok {
		w.buf.Write(b)
		w.buf.WriteString("\n\n")
		return w.flush()
	}
	w.buf.Truncate(w.buf.Len() - len("data: "))
	// A copy for encoding/json, which keeps what it is given: c stays the
	// caller's (on its stack, for a token's chunk on the fast path).
	cc := *c
	return w.data(&cc)
}

// WriteChunkID writes c as one event with the given id ("": none), the
// positions of a stream of several choices.
func (w *Writer) WriteChunkID(c *Chunk, id string) error {
	w.buf.Reset()
	if id != "" {
		w.buf.WriteString("id: ")
		w.buf.WriteString(id)
		w.buf.WriteByte('\n')
	}
	return w.data(c)
}

// WriteUsage writes the usage chunk of a stream that asked for it: c's
// usage, with no choices, after the end chunk.
func (w *Writer) WriteUsage(c *Chunk) error {
	w.buf.Reset()
	return w.data(struct {
		ID                string   `json:"id"`
		Object            string   `json:"object"`
		Created           int64    `json:"created,omitempty"`
		Model             string   `json:"model"`
		SystemFingerprint string   `json:"system_fingerprint,omitempty"`
		Choices           []Choice `json:"choices"`
		Usage             *Usage   `json:"usage"`
	}{c.ID, c.Object, c.Created, c.Model, c.SystemFingerprint, []Choice{}, c.Usage})
}

// WriteEvent writes v as one event of type typ ("": the default) with
// id ("": none): the Responses API's events.
func (w *Writer) WriteEvent(typ, id string, v any) error {
	w.buf.Reset()
	if id != "" {
		w.buf.WriteString("id: ")
		w.buf.WriteString(id)
		w.buf.WriteByte('\n')
	}
	if typ != "" {
		w.buf.WriteString("event: ")
		w.buf.WriteString(typ)
		w.buf.WriteByte('\n')
	}
	return w.data(v)
}

// WriteError writes the event that ends a failed stream.
func (w *Writer) WriteError(e Error) error {
	w.buf.Reset()
	return w.data(errorEvent{Error: e})
}

// WriteDone writes the event that ends a stream.
func (w *Writer) WriteDone() error {
	w.buf.Reset()
	w.buf.WriteString("data: " + Done + "\n\n")
	return w.flush()
}

// data appends a data line holding v, and the blank line that ends the
// event, and writes the event.
func (w *Writer) data(v any) error {
	w.buf.WriteString("data: ")
	if err := w.enc.Encode(v); err != nil { // one line: JSON has no raw newlines
		return err
	}
	w.buf.WriteByte('\n')
	return w.flush()
}

func (w *Writer) flush() error {
	_, err := w.w.Write(w.buf.Bytes())
	return err
}
