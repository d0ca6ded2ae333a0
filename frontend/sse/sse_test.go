package sse

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

func ptr[T any](v T) *T { return &v }

// stream is a completion stream as the frontend writes it: a keepalive,
// two tokens, the end chunk with a migration and a P/D hand-off, [DONE].
func stream(t testing.TB, chat bool) ([]byte, []Chunk) {
	var b bytes.Buffer
	w := NewWriter(&b)
	if err := w.WriteComment("lifeline"); err != nil {
		t.Fatal(err)
	}
	chunk := func(text string, finish *string, ll Lifeline) Chunk {
		c := Chunk{ID: "cmpl-1", Object: "text_completion", Model: "small", Lifeline: ll}
		c.Choices[0].FinishReason = finish
		if chat {
			c.Object, c.Choices[0].Delta = "chat.completion.chunk", &Delta{Content: text}
		} else {
			c.Choices[0].Text = &text
		}
		return c
	}
	chunks := []Chunk{
		chunk(" once", nil, Lifeline{RequestID: "cmpl-1", SequenceNo: 1, TokenID: 0, InstanceID: "n0-decode-0"}),
		chunk(" \"upon\"\n<a>", nil, Lifeline{RequestID: "cmpl-1", SequenceNo: 2, TokenID: 7, InstanceID: "n1-decode-0"}),
		chunk("", ptr("length"), Lifeline{RequestID: "cmpl-1", Migrations: 1, PD: "same_node",
			PDTimelineMs:  map[string]float64{"prefill": 1.5, "transfer": 0, "decode_first_token": 2.25},
			LastMigration: map[string]int64{"failure_seen_unix_ns": 1, "routed_unix_ns": 2, "dispatched_unix_ns": 3, "first_token_unix_ns": 4}}),
	}
	for i := range chunks {
		if err := w.WriteChunk(&chunks[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteDone(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes(), chunks
}

// TestWireFormat pins the bytes of each event: a token's chunk has its
// sequence number as the event id and exactly the token fields; the end
// chunk has no id and exactly the summary fields, zero or not.
func TestWireFormat(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	w.WriteComment("lifeline")
	text := " hi"
	tok := Chunk{ID: "c", Object: "text_completion", Model: "m", Lifeline: Lifeline{RequestID: "c", SequenceNo: 3, TokenID: 0, InstanceID: "i"}}
	tok.Choices[0].Text = &text
	w.WriteChunk(&tok)
	end := Chunk{ID: "c", Object: "chat.completion.chunk", Model: "m", Lifeline: Lifeline{RequestID: "c"}}
	end.Choices[0].Delta, end.Choices[0].FinishReason = &Delta{}, ptr("stop")
	w.WriteChunk(&end)
	end.Lifeline.PD = "same_node"
	w.WriteChunk(&end)
	w.WriteError(Error{Message: "no instance can serve the request", Type: "no_capacity"})
	w.WriteDone()
	want := `: lifeline

id: 3
data: {"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":" hi","finish_reason":null}],"lifeline":{"request_id":"c","sequence_no":3,"token_id":0,"instance_id":"i"}}

data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"lifeline":{"request_id":"c","migrations":0,"kv_reused_positions":0}}

data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"lifeline":{"request_id":"c","migrations":0,"kv_reused_positions":0,"pd":"same_node","kv_transfer_bytes":0,"pd_timeline_ms":null}}

data: {"error":{"message":"no instance can serve the request","type":"no_capacity"}}

data: [DONE]

`
	if b.String() != want {
		t.Fatalf("wire format:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestRoundTrip: what the writer encodes, the reader returns: every chunk
// with its id, then io.EOF at [DONE], and io.EOF again after it.
func TestRoundTrip(t *testing.T) {
	for _, chat := range []bool{false, true} {
		raw, chunks := stream(t, chat)
		// One byte at a time too: events split across reads.
		for _, src := range []io.Reader{bytes.NewReader(raw), iotest.OneByteReader(bytes.NewReader(raw))} {
			r := NewReader(src)
			for i, want := range chunks {
				ev, err := r.Next()
				if err != nil {
					t.Fatalf("chat %v, event %d: %v", chat, i, err)
				}
				wantID := ""
				if want.Lifeline.SequenceNo > 0 {
					wantID = strconv.Itoa(want.Lifeline.SequenceNo)
				}
				if ev.Chunk == nil || ev.Error != nil || ev.ID != wantID || !reflect.DeepEqual(*ev.Chunk, want) {
					t.Fatalf("chat %v, event %d: %+v (chunk %+v), want %+v", chat, i, ev, ev.Chunk, want)
				}
				if !json.Valid(ev.Data) {
					t.Fatalf("data %q", ev.Data)
				}
			}
			if c := chunks[1]; c.Content() != " \"upon\"\n<a>" || c.Finish() != "" || chunks[2].Finish() != "length" {
				t.Fatalf("content %q, finish %q %q", c.Content(), c.Finish(), chunks[2].Finish())
			}
			for range 2 {
				if _, err := r.Next(); err != io.EOF {
					t.Fatalf("after [DONE]: %v", err)
				}
			}
		}
	}
}

// TestErrorEvent: the event that ends a failed stream comes back typed.
func TestErrorEvent(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	w.WriteError(Error{Message: "deadline passed after 3 tokens", Type: "deadline_exceeded"})
	w.WriteDone()
	r := NewReader(&b)
	ev, err := r.Next()
	if err != nil || ev.Chunk != nil || ev.Error == nil || ev.Error.Type != "deadline_exceeded" || ev.Error.Message != "deadline passed after 3 tokens" {
		t.Fatalf("%+v, %v", ev, err)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after [DONE]: %v", err)
	}
}

// TestCommentsAndFields: keepalives, CRLF line ends, unknown fields, an
// event field, a field without a space after its colon, an event without
// data and multi-line data are read as the SSE standard has it.
func TestCommentsAndFields(t *testing.T) {
	in := ": lifeline\r\n\r\n" +
		": keepalive\n\n" +
		"retry: 3000\nid: 9\n\n" + // no data: not an event
		"event: token\r\nid:4\r\nfoo: bar\r\ndata: {\"id\":\"c\",\r\ndata:\"lifeline\":{\"sequence_no\":4}}\r\n\r\n" +
		"data:[DONE]\n\n"
	r := NewReader(strings.NewReader(in))
	ev, err := r.Next()
	if err != nil || ev.ID != "4" || ev.Type != "token" || ev.Chunk == nil || ev.Chunk.ID != "c" || ev.Chunk.Lifeline.SequenceNo != 4 {
		t.Fatalf("%+v (%+v), %v", ev, ev.Chunk, err)
	}
	if string(ev.Data) != "{\"id\":\"c\",\n\"lifeline\":{\"sequence_no\":4}}" {
		t.Fatalf("data %q", ev.Data)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

// TestMalformed: contents that are not a stream of chunks fail with
// ErrMalformed and the line; a stream cut off before [DONE] fails with
// io.ErrUnexpectedEOF; the underlying reader's error comes through.
func TestMalformed(t *testing.T) {
	for _, in := range []string{
		"data: {\"id\":\n\n",
		"data: [1,2]\n\n",
		"data: null\n\n",
		"data: \"text\"\n\n",
		"data:\n\n",
		"data: {\"choices\":\"x\"}\n\n",
		"data: {\"lifeline\":{\"sequence_no\":\"1\"}}\n\n",
	} {
		_, err := NewReader(strings.NewReader(": ok\n\n" + in)).Next()
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "line 3") {
			t.Errorf("%q: %v", in, err)
		}
	}
	raw, _ := stream(t, false)
	for _, cut := range []int{0, 5, bytes.Index(raw, []byte("id: 2")), len(raw) - 3} {
		r := NewReader(bytes.NewReader(raw[:cut]))
		var err error
		for err == nil {
			_, err = r.Next()
		}
		if err != io.ErrUnexpectedEOF {
			t.Errorf("cut at %d: %v", cut, err)
		}
	}
	boom := errors.New("connection reset")
	if _, err := NewReader(iotest.ErrReader(boom)).Next(); !errors.Is(err, boom) {
		t.Errorf("read error: %v", err)
	}
}

// TestLongLine: a line past the bound fails without being buffered whole;
// one at the bound is read.
func TestLongLine(t *testing.T) {
	for _, n := range []int{MaxLine + 1, 4 * MaxLine} {
		// A reader that never ends: the bound, not the stream's end, stops it.
		src := io.MultiReader(strings.NewReader("data: {\"id\":\""), infinite('x'))
		_, err := NewReader(io.LimitReader(src, int64(n))).Next()
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "longer than") {
			t.Fatalf("%d bytes: %v", n, err)
		}
	}
	r := NewReader(infinite('a'))
	if _, err := r.Next(); !errors.Is(err, ErrMalformed) || cap(r.buf) > 2*MaxLine {
		t.Fatalf("endless line: %v, buffered %d", err, cap(r.buf))
	}
	id := strings.Repeat("y", MaxLine-len(`data: {"id":""}`))
	ev, err := NewReader(strings.NewReader("data: {\"id\":\"" + id + "\"}\r\n\r\n")).Next()
	if err != nil || ev.Chunk.ID != id {
		t.Fatalf("line at the bound: %v", err)
	}
}

type infinite byte

func (b infinite) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

// TestStandardLibraryOnly: clients, benchmarks and tests import this
// package; it links nothing but the standard library.
func TestStandardLibraryOnly(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pf, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range pf.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s", f, path)
			}
		}
	}
}

// FuzzSSEReader: whatever the bytes, the reader returns events, io.EOF,
// io.ErrUnexpectedEOF or ErrMalformed — never panics, never loops — and
// an event's chunk re-encodes to a chunk that reads back the same.
func FuzzSSEReader(f *testing.F) {
	for _, chat := range []bool{false, true} {
		raw, _ := stream(f, chat)
		f.Add(raw)
		f.Add(bytes.ReplaceAll(raw, []byte("\n"), []byte("\r\n")))
		f.Add(raw[:len(raw)/2])
	}
	f.Add([]byte("data: {\"error\":{\"message\":\"m\",\"type\":\"t\"}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte(":\n\nid\nevent\ndata\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := NewReader(bytes.NewReader(in))
		r.max = 256 // reach the bound with small inputs
		for range len(in) + 1 {
			ev, err := r.Next()
			switch {
			case err == io.EOF || err == io.ErrUnexpectedEOF || errors.Is(err, ErrMalformed):
				return
			case err != nil:
				t.Fatalf("unexpected error: %v", err)
			case (ev.Chunk == nil) == (ev.Error == nil):
				t.Fatalf("event with chunk %v and error %v", ev.Chunk, ev.Error)
			case ev.Chunk != nil:
				var b bytes.Buffer
				NewWriter(&b).WriteChunk(ev.Chunk)
				back, err := NewReader(&b).Next()
				if err != nil || back.Chunk == nil {
					t.Fatalf("re-encoded %q: %v", b.String(), err)
				}
				if again, _ := json.Marshal(back.Chunk); !bytes.Equal(again, mustMarshal(t, ev.Chunk)) {
					t.Fatalf("re-encoding changed the chunk:\n%s\n%s", mustMarshal(t, ev.Chunk), again)
				}
			}
		}
		t.Fatal("more events than bytes")
	})
}

func mustMarshal(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
