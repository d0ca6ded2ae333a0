package frontend

import (
	"reflect"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// TestToolCallsCutShort: an output cut after its first call closed (by
// length, or an error) delivers that call, and only it, in the stream, in
// the whole response and in the record's ids; the fragment after it is in
// neither shape. One cut before any call closed is its text in both.
func TestToolCallsCutShort(t *testing.T) {
	tc := &ToolCalls{Parallel: true}
	out := textToks(`{"tool_calls":[`, `{"a":{}}`, `,{"g":`, `{"x`)
	id0 := []string{callID("chatcmpl-1", 0)}
	if got := callIDs("chatcmpl-1", tc, out); !reflect.DeepEqual(got, id0) {
		t.Fatalf("record's call ids %v, want %v (call 0 was delivered)", got, id0)
	}
	body := CompletionRequest{Model: "m", ToolCalls: tc}
	st := finishedWith("chatcmpl-1", body, true, out, "length")
	evs := events(t, st, 0)
	var content strings.Builder
	var streamed []string
	for _, ev := range evs {
		if ev.Chunk == nil || len(ev.Chunk.Choices) == 0 {
			continue
		}
		content.WriteString(ev.Chunk.Content())
		if d := ev.Chunk.Choices[0].Delta; d != nil {
			for _, c := range d.ToolCalls {
				streamed = append(streamed, c.ID)
			}
		}
	}
	end := evs[len(evs)-1].Chunk
	if content.Len() != 0 || !reflect.DeepEqual(streamed, id0) || end.Finish() != "length" || !reflect.DeepEqual(end.Lifeline.ToolCalls, id0) {
		t.Fatalf("stream: content %q, calls %v, end %+v", content.String(), streamed, end)
	}
	var res struct {
		Choices []struct {
			Message struct {
				Content   *string
				ToolCalls []sse.ToolCall `json:"tool_calls"`
			}
			FinishReason string `json:"finish_reason"`
		}
	}
	whole(t, st, &res)
	m := res.Choices[0].Message
	if m.Content != nil || len(m.ToolCalls) != 1 || m.ToolCalls[0].ID != id0[0] || res.Choices[0].FinishReason != "length" {
		t.Fatalf("whole: %+v", res)
	}

	// Cut before any call closed: text in both shapes.
	cut := textToks(`{"tool_calls":[`, `{"g":`, `{"x`)
	st = finishedWith("chatcmpl-2", body, true, cut, "length")
	content.Reset()
	for _, ev := range events(t, st, 0) {
		if ev.Chunk != nil && len(ev.Chunk.Choices) > 0 {
			content.WriteString(ev.Chunk.Content())
		}
	}
	res.Choices = nil
	whole(t, st, &res)
	text := `{"tool_calls":[{"g":{"x`
	if content.String() != text || res.Choices[0].Message.Content == nil || *res.Choices[0].Message.Content != text || callIDs("chatcmpl-2", tc, cut) != nil {
		t.Fatalf("cut before a call: streamed %q, whole %+v", content.String(), res)
	}
}
