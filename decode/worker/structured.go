package worker

import (
	"crypto/sha256"
	"fmt"
	"sync"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/decode/wire"
)

// schemaCacheSize bounds the compiled schemas a worker keeps: a hot schema
// (one application's response_format or tools) compiles once, a stream of
// distinct ones costs at most this much memory.
const schemaCacheSize = 64

// schemaCache holds compiled schemas (and refusals, so a bad schema sent
// again is not recompiled either) by the SHA-256 of their bytes, the
// oldest evicted first.
type schemaCache struct {
	mu      sync.Mutex
	entries map[[32]byte]compiled
	order   [][32]byte
	// compiles counts Compile calls (tests check that hits do not).
	compiles int
}

type compiled struct {
	a   *grammar.Automaton
	err error
}

func (c *schemaCache) get(schema []byte) (*grammar.Automaton, error) {
	key := sha256.Sum256(schema)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		return e.a, e.err
	}
	// Compile is bounded (MaxNodes, MaxDepth): holding the lock is cheap
	// and keeps one compile per schema.
	a, err := grammar.Compile(schema)
	c.compiles++
	if c.entries == nil {
		c.entries = make(map[[32]byte]compiled)
	}
	if len(c.order) >= schemaCacheSize {
		delete(c.entries, c.order[0])
		c.order = c.order[1:]
	}
	c.entries[key] = compiled{a, err}
	c.order = append(c.order, key)
	return a, err
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

// setLogprobs copies an event's logprobs onto its frame.
func setLogprobs(f *wire.Frame, ev decode.Event) {
	f.Logprob = ev.Logprob
	for _, t := range ev.TopLogprobs {
		f.TopLogprobs = append(f.TopLogprobs, &wire.TopLogprob{TokenId: int32(t.ID), Logprob: t.Logprob})
	}
}
