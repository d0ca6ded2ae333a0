package worker

import (
	"crypto/sha256"
	"fmt"
	"sync"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/decode/wire"
)

// schemaCacheSize and schemaCacheBytes bound the compiled schemas a
// worker keeps: a hot schema (one application's response_format or tools)
// compiles once, a stream of distinct ones costs at most this much memory
// (grammar's bounds keep one automaton to a few MiB).
const (
	schemaCacheSize  = 64
	schemaCacheBytes = 64 << 20
)

// schemaCache holds compiled schemas (and refusals, so a bad schema sent
// again is not recompiled either) by the SHA-256 of their bytes, the
// oldest evicted first. A schema compiles outside the lock, once: the
// requests that want it meanwhile wait for that compile, those of other
// schemas do not.
type schemaCache struct {
	mu      sync.Mutex
	entries map[[32]byte]*cacheEntry
	order   [][32]byte
	bytes   int // the compiled entries' footprints
	// compiles counts Compile calls (tests check that hits do not).
	compiles int
	// compile is grammar.Compile unless a test sets it.
	compile func([]byte) (*grammar.Automaton, error)
}

// cacheEntry is one schema's compile; a, err and size are set before
// ready closes.
type cacheEntry struct {
	ready chan struct{}
	a     *grammar.Automaton
	err   error
	size  int // footprint, counted in bytes once compiled (under mu)
}

func (c *schemaCache) get(schema []byte) (*grammar.Automaton, error) {
	key := sha256.Sum256(schema)
	c.mu.Lock()
	if e, ok := c.entries[key]; ok {
		c.mu.Unlock()
		<-e.ready // a compile is bounded by grammar's limits: milliseconds
		return e.a, e.err
	}
	e := &cacheEntry{ready: make(chan struct{})}
	if c.entries == nil {
		c.entries = make(map[[32]byte]*cacheEntry)
	}
	c.entries[key] = e
	c.order = append(c.order, key)
	c.compiles++
	c.evict()
	compile := c.compile
	c.mu.Unlock()
	if compile == nil {
		compile = grammar.Compile
	}
	a, err := compile(schema)
	size := len(schema)
	if a != nil {
		size = a.Footprint()
	}
	c.mu.Lock()
	e.a, e.err = a, err
	if c.entries[key] == e {
		e.size = size
		c.bytes += size
		c.evict()
	}
	c.mu.Unlock()
	close(e.ready)
	return a, err
}

// evict drops the oldest entries while more than schemaCacheSize are kept or they hold
// more than schemaCacheBytes (the newest stays whatever its size).
func (c *schemaCache) evict() {
	for len(c.order) > schemaCacheSize || (c.bytes > schemaCacheBytes && len(c.order) > 1) {
		old := c.order[0]
		c.bytes -= c.entries[old].size
		delete(c.entries, old)
		c.order = c.order[1:]
	}
}

// structured is g's grammar for the engine: nil for free text, a
// RequestError on response_format for a schema that does not compile.
func (s *server) structured(g *wire.Generate) (*decode.Structured, error) {
	st := g.GetStructured()
	var a *grammar.Automaton
	switch st.GetKind() {
	case wire.Structured_NONE:
		return nil, nil
	case wire.Structured_JSON_OBJECT:
		a = grammar.JSONObject()
	case wire.Structured_JSON_SCHEMA:
		var err error
		if a, err = s.schemas.get(st.Schema); err != nil {
			return nil, &decode.RequestError{Field: "response_format", Reason: err.Error()}
		}
	default:
		return nil, &decode.RequestError{Field: "response_format", Reason: fmt.Sprintf("unknown structured kind %d", st.GetKind())}
	}
	return &decode.Structured{Automaton: a, Optional: st.Optional}, nil
}

// setLogprobs copies an event's logprobs onto its frame, with the
// tokens' bytes in the model's vocabulary (which the frontend may not
// know: a GGUF model's).
func (s *server) setLogprobs(f *wire.Frame, g *wire.Generate, ev decode.Event) {
	if !g.Logprobs {
		return
	}
	tok := s.engine.Tokenizer
	f.Logprob, f.Piece = ev.Logprob, tok.Piece(0, ev.TokenID)
	for _, t := range ev.TopLogprobs {
		f.TopLogprobs = append(f.TopLogprobs, &wire.TopLogprob{TokenId: int32(t.ID), Logprob: t.Logprob, Piece: tok.Piece(0, t.ID)})
	}
}
