package decode

import (
	"errors"
	"sync"

	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// Structured constrains a request's output to a compiled grammar
// (structured output, tool calls).
type Structured struct {
	Automaton *grammar.Automaton
	// Optional lets the output be free text unless its first byte is '{'.
	Optional bool
}

// grammarVocab is the engine's vocabulary prepared for masking, built on
// first use and shared by every structured request.
type grammarVocab struct {
	once  sync.Once
	vocab *grammar.Vocab
}

// GrammarVocab returns the tokenizer's pieces as a masking trie: every
// token's bytes mid-stream (an output token never follows BOS directly, so
// no leading space is dropped), end-of-sequence as the tokenizer's EOS.
func (e *Engine) GrammarVocab() *grammar.Vocab {
	e.gvocab.once.Do(func() { e.gvocab.vocab = VocabOf(e.Tokenizer) })
	return e.gvocab.vocab
}

// VocabOf builds the masking trie of a tokenizer's pieces.
func VocabOf(tok tokenizer.Tokenizer) *grammar.Vocab {
	pieces := make([][]byte, tok.VocabSize())
	for id := range pieces {
		pieces[id] = tok.Piece(tok.EOS(), id)
	}
	return grammar.NewVocab(pieces, tok.EOS())
}

// checkStructured validates the structured-output and logprobs fields.
func checkStructured(r *Request) error {
	if r.TopLogprobs < 0 || r.TopLogprobs > sample.MaxTopLogprobs {
		return badField("top_logprobs", "%d (want 0..%d)", r.TopLogprobs, sample.MaxTopLogprobs)
	}
	if r.TopLogprobs > 0 && !r.Logprobs {
		return badField("top_logprobs", "needs logprobs")
	}
	if r.Structured != nil && r.Structured.Automaton == nil {
		return badField("response_format", "no grammar")
	}
	return nil
}

// schedGrammar is r's grammar for the scheduler, nil for free text.
func (e *Engine) schedGrammar(r *Request) *sched.Grammar {
	if r.Structured == nil {
		return nil
	}
	return &sched.Grammar{Automaton: r.Structured.Automaton, Vocab: e.GrammarVocab(), Optional: r.Structured.Optional}
}

// submitError names the request field a scheduler refusal is about: a
// structured request whose budget cannot hold the value is a max_tokens
// error, one whose prefix the grammar refuses a response_format error.
func submitError(err error) error {
	var ge *sched.GrammarError
	if !errors.As(err, &ge) {
		return err
	}
	if errors.Is(err, sched.ErrBudget) {
		return badField("max_tokens", "%v", ge.Err)
	}
	return badField("response_format", "%v", ge.Err)
}
