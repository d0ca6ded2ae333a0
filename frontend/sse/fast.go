package sse

import (
	"encoding/json"
	"strconv"
)

// A token's chunk is most of what a frontend writes: one per token per
// stream. appendTokenChunk writes it by hand, byte for byte what
// encoding/json writes (TestTokenChunkFastPath compares the two), at a
// fraction of the reflection's cost; any other chunk takes encoding/json.

// appendTokenChunk appends c's JSON when c is a plain token chunk (a
// sequence number, text or a delta without tool calls, no logprobs, no
// finish, no usage); ok is false, b unchanged, otherwise.
func appendTokenChunk(b []byte, c *Chunk) (_ []byte, ok bool) {
	ch := &c.Choices[0]
	if c.Usage != nil || c.Lifeline.SequenceNo <= 0 || ch.Logprobs != nil || ch.FinishReason != nil ||
		(ch.Text == nil) == (ch.Delta == nil) || ch.Delta != nil && ch.Delta.ToolCalls != nil {
		return b, false
	}
	b = append(b, `{"id":`...)
	b = appendString(b, c.ID)
	b = append(b, `,"object":`...)
	b = appendString(b, c.Object)
	if c.Created != 0 {
		b = append(b, `,"created":`...)
		b = strconv.AppendInt(b, c.Created, 10)
	}
	b = append(b, `,"model":`...)
	b = appendString(b, c.Model)
	if c.SystemFingerprint != "" {
		b = append(b, `,"system_fingerprint":`...)
		b = appendString(b, c.SystemFingerprint)
	}
	b = append(b, `,"choices":[{"index":`...)
	b = strconv.AppendInt(b, int64(ch.Index), 10)
	if ch.Text != nil {
		b = append(b, `,"text":`...)
		b = appendString(b, *ch.Text)
	} else {
		b = append(b, `,"delta":{`...)
		if ch.Delta.Role != "" {
			b = append(b, `"role":`...)
			b = appendString(b, ch.Delta.Role)
		}
		if ch.Delta.Content != "" {
			if ch.Delta.Role != "" {
				b = append(b, ',')
			}
			b = append(b, `"content":`...)
			b = appendString(b, ch.Delta.Content)
		}
		b = append(b, '}')
	}
	l := &c.Lifeline
	b = append(b, `,"finish_reason":null}],"lifeline":{"request_id":`...)
	b = appendString(b, l.RequestID)
	b = append(b, `,"sequence_no":`...)
	b = strconv.AppendInt(b, int64(l.SequenceNo), 10)
	b = append(b, `,"token_id":`...)
	b = strconv.AppendInt(b, int64(l.TokenID), 10)
	b = append(b, `,"instance_id":`...)
	b = appendString(b, l.InstanceID)
	return append(b, "}}"...), true
}

// appendString appends s as a JSON string: as is between quotes when it
// is printable ASCII that encoding/json leaves alone, else as
// encoding/json escapes it (HTML characters included, as an Encoder's
// default).
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
