package sse

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestTokenChunkFastPath: the hand-written token chunk is byte for byte
// what encoding/json writes, for chunks of every shape the fast path
// takes (and strings it must escape); the shapes it leaves take
// encoding/json.
func TestTokenChunkFastPath(t *testing.T) {
	texts := []string{"", "plain", " a b", `quote " and \ back`, "<b>&amp;</b>", "tab\tnew\nline\r\x00\x1f", "é漢字🙂", "\u2028\u2029", "bad \xff utf-8", "\x7f del"}
	var chunks []Chunk
	for i, text := range texts {
		for _, shape := range []int{0, 1, 2} {
			c := Chunk{ID: "cmpl-" + text, Object: "chat.completion.chunk", Created: int64(i) * 1000, Model: "tiny" + text,
				SystemFingerprint: text, Lifeline: Lifeline{RequestID: "r" + text, SequenceNo: i + 1, TokenID: i * 7, InstanceID: text}}
			switch shape {
			case 0:
				c.Choices[0].Text = &texts[i]
			case 1:
				c.Choices[0].Delta = &Delta{Content: text}
			case 2:
				c.Choices[0].Delta = &Delta{Role: "assistant", Content: text}
				c.Choices[0].Index = i
			}
			chunks = append(chunks, c)
		}
	}
	for _, c := range chunks {
		want, err := json.Marshal(&c)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := appendTokenChunk(nil, &c)
		if !ok || !bytes.Equal(got, want) {
			t.Fatalf("fast path (taken %v):\n%s\nencoding/json:\n%s", ok, got, want)
		}
		var viaWriter, viaEncoder bytes.Buffer
		NewWriter(&viaWriter).WriteChunk(&c)
		w := NewWriter(&viaEncoder)
		w.buf.WriteString("id: " + itoa(c.Lifeline.SequenceNo) + "\n")
		w.data(&c)
		if viaWriter.String() != viaEncoder.String() {
			t.Fatalf("WriteChunk %q, the encoder's event %q", viaWriter.String(), viaEncoder.String())
		}
	}
	finish, n := "stop", 3
	for name, c := range map[string]Chunk{
		"finish":     {Choices: [1]Choice{{Text: &finish, FinishReason: &finish}}, Lifeline: Lifeline{SequenceNo: 2}},
		"usage":      {Choices: [1]Choice{{Text: &finish}}, Usage: &Usage{TotalTokens: 1}, Lifeline: Lifeline{SequenceNo: 2}},
		"logprobs":   {Choices: [1]Choice{{Text: &finish, Logprobs: &Logprobs{}}}, Lifeline: Lifeline{SequenceNo: 2}},
		"tool calls": {Choices: [1]Choice{{Delta: &Delta{ToolCalls: []ToolCall{{Index: &n}}}}}, Lifeline: Lifeline{SequenceNo: 2}},
		"end":        {Choices: [1]Choice{{Text: &finish}}},
		"neither":    {Lifeline: Lifeline{SequenceNo: 2}},
	} {
		if _, ok := appendTokenChunk(nil, &c); ok {
			t.Errorf("%s chunk: taken by the fast path", name)
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
