package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// toolSchema is what a frontend compiles for two tools: exactly one call.
const toolSchema = `{"type":"object","properties":{
	"get_weather":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]},
	"set_alarm":{"type":"object","properties":{"at":{"type":"string"},"loud":{"type":"boolean"}},"required":["at","loud"]}},
	"minProperties":1,"maxProperties":1}`

func structuredGen(id string, epoch uint64, maxTokens int32) *wire.Generate {
	return &wire.Generate{RequestId: id, RequestEpoch: epoch, Prompt: "Call a tool:", MaxTokens: maxTokens,
		Temperature: 1, Seed: 5, DetachGraceMs: 5000, Logprobs: true, TopLogprobs: 3,
		Structured: &wire.Structured{Kind: wire.Structured_JSON_SCHEMA, Schema: []byte(toolSchema)}}
}

func sameLogprobs(a, b *wire.Frame) bool {
	if math.Float64bits(a.Logprob) != math.Float64bits(b.Logprob) || len(a.TopLogprobs) != len(b.TopLogprobs) {
		return false
	}
	for i := range a.TopLogprobs {
		x, y := a.TopLogprobs[i], b.TopLogprobs[i]
		if x.TokenId != y.TokenId || math.Float64bits(x.Logprob) != math.Float64bits(y.Logprob) {
			return false
		}
	}
	return true
}

// TestStructuredOverQUIC: a json_schema request with logprobs through a
// real worker yields one valid tool call, ends with stop, carries logprob
// and top_logprobs on every token frame; a continuation from a prefix (a
// migration) and an Attach to the detached request give the same frames,
// logprobs included.
func TestStructuredOverQUIC(t *testing.T) {
	t.Parallel()
	w := newTestWorker(t)
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	s, err := c.Generate(ctx, structuredGen("s", 1, 40))
	if err != nil {
		t.Fatal(err)
	}
	want := clustertest.CollectFrames(t, s)
	last := want[len(want)-1]
	if last.FinishReason != "stop" || last.Error != nil {
		t.Fatalf("finish %+v", last)
	}
	var text strings.Builder
	var prefix []int32
	for _, f := range want[:len(want)-1] {
		if f.Logprob >= 0 || len(f.TopLogprobs) != 3 || f.TopLogprobs[0].Logprob < f.TopLogprobs[2].Logprob {
			t.Fatalf("frame %d: logprob %v, top %v", f.SequenceNo, f.Logprob, f.TopLogprobs)
		}
		text.WriteString(f.Text)
		prefix = append(prefix, f.TokenId)
	}
	var call map[string]map[string]any
	if err := json.Unmarshal([]byte(text.String()), &call); err != nil || len(call) != 1 {
		t.Fatalf("output %q: %v, %d calls", text.String(), err, len(call))
	}
	t.Logf("tool call: %s", text.String())

	// A migration after k tokens: another request continues from them.
	k := len(prefix) / 2
	g := structuredGen("s2", 1, 40)
	g.PrefixTokens = prefix[:k]
	s2, err := c.Generate(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	cont := clustertest.CollectFrames(t, s2)
	if len(cont) != len(want)-k {
		t.Fatalf("continuation: %d frames, want %d", len(cont), len(want)-k)
	}
	for i, f := range cont {
		o := want[k+i]
		if f.SequenceNo != o.SequenceNo || f.TokenId != o.TokenId || f.Text != o.Text || f.FinishReason != o.FinishReason || !sameLogprobs(f, o) {
			t.Fatalf("continuation frame %d: %+v, want %+v", i, f, o)
		}
	}

	// The frame log keeps the new fields: an Attach replays them.
	att := clustertest.CollectFrames(t, attachOK(t, ctx, c, "s", 2, 1))
	if len(att) != len(want) {
		t.Fatalf("attach: %d frames, want %d", len(att), len(want))
	}
	for i, f := range att {
		if f.TokenId != want[i].TokenId || !sameLogprobs(f, want[i]) {
			t.Fatalf("attached frame %d: %+v, want %+v", i, f, want[i])
		}
	}
}

// TestStructuredRefusedOverQUIC: a schema that does not compile, a budget
// that cannot hold the shortest value and top_logprobs out of range are
// INVALID_REQUEST, with a message naming the parameter.
func TestStructuredRefusedOverQUIC(t *testing.T) {
	t.Parallel()
	c := newTestWorker(t).dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	badSchema := structuredGen("a", 1, 40)
	badSchema.Structured.Schema = []byte(`{"type":"string","pattern":"x"}`)
	tiny := structuredGen("b", 1, 5)
	top := structuredGen("c", 1, 40)
	top.TopLogprobs = 21
	kind := structuredGen("d", 1, 40)
	kind.Structured.Kind = 7
	for _, tt := range []struct {
		g    *wire.Generate
		want string
	}{
		{badSchema, "response_format"}, {tiny, "max_tokens"}, {top, "top_logprobs"}, {kind, "response_format"},
	} {
		for _, grace := range []uint32{0, 5000} { // plain and detachable paths
			tt.g.DetachGraceMs = grace
			tt.g.RequestId = fmt.Sprintf("%s-%d", tt.g.RequestId, grace)
			s, err := c.Generate(ctx, tt.g)
			if err != nil {
				t.Fatal(err)
			}
			fs := clustertest.CollectFrames(t, s)
			e := fs[len(fs)-1].Error
			if len(fs) != 1 || e.GetCode() != wire.Code_INVALID_REQUEST || !strings.Contains(e.GetMessage(), tt.want) {
				t.Errorf("%s: %d frames, error %v; want INVALID_REQUEST naming %s", tt.g.RequestId, len(fs), e, tt.want)
			}
		}
	}
}

// TestSchemaCache: a schema compiles once however often it comes, a
// refused one too, and the cache stays bounded.
func TestSchemaCache(t *testing.T) {
	t.Parallel()
	var c schemaCache
	for range 3 {
		if a, err := c.get([]byte(toolSchema)); a == nil || err != nil {
			t.Fatal(err)
		}
		if _, err := c.get([]byte(`{"pattern":"x"}`)); err == nil {
			t.Fatal("bad schema compiled")
		}
	}
	if c.compiles != 2 {
		t.Fatalf("%d compiles, want 2", c.compiles)
	}
	for i := range 2 * schemaCacheSize {
		c.get(fmt.Appendf(nil, `{"type":"object","properties":{"p%d":{}}}`, i))
	}
	if len(c.entries) != schemaCacheSize || len(c.order) != schemaCacheSize {
		t.Fatalf("%d entries, %d in order; want %d", len(c.entries), len(c.order), schemaCacheSize)
	}
}

// TestSchemaCacheCompilesOutsideLock: a schema that takes long to compile
// stalls the requests of that schema only; those wait for the one compile.
func TestSchemaCacheCompilesOutsideLock(t *testing.T) {
	t.Parallel()
	slow := []byte(`{"type":"string"}`)
	entered, release := make(chan struct{}), make(chan struct{})
	c := schemaCache{compile: func(b []byte) (*grammar.Automaton, error) {
		if bytes.Equal(b, slow) {
			close(entered)
			<-release
		}
		return grammar.Compile(b)
	}}
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	results := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := c.get(slow)
			results <- err
		}()
	}
	<-entered
	other := make(chan error, 1)
	go func() {
		_, err := c.get([]byte(toolSchema))
		other <- err
	}()
	select {
	case err := <-other:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a schema waited for another schema's compile")
	}
	select {
	case err := <-results:
		t.Fatalf("a request of the slow schema returned (%v) before its compile ended", err)
	default:
	}
	close(release)
	for range 2 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.compiles != 2 {
		t.Fatalf("%d compiles, want 2 (one a schema)", c.compiles)
	}
}

// TestSchemaCacheBoundsBytes: large automata are evicted by their
// footprint before the entry count is reached.
func TestSchemaCacheBoundsBytes(t *testing.T) {
	t.Parallel()
	var c schemaCache
	for i := range 24 {
		vals := make([]string, 600)
		for j := range vals {
			vals[j] = fmt.Sprintf("%03d%05d%s", i, j, strings.Repeat("x", 95))
		}
		b, _ := json.Marshal(map[string]any{"enum": vals})
		if _, err := c.get(b); err != nil {
			t.Fatal(err)
		}
	}
	if c.bytes > schemaCacheBytes || len(c.entries) >= 24 || len(c.entries) != len(c.order) {
		t.Fatalf("%d entries (%d in order) holding %d bytes; want at most %d bytes", len(c.entries), len(c.order), c.bytes, schemaCacheBytes)
	}
}
