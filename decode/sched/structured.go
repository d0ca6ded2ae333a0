package sched

import (
	"errors"
	"fmt"

	"github.com/lifeline-llm/lifeline/decode/grammar"
)

// Grammar constrains a request's output to a structured value.
type Grammar struct {
	Automaton *grammar.Automaton
	// Vocab is the engine's vocabulary prepared for masking (built once
	// per engine); its pieces advance the automaton.
	Vocab *grammar.Vocab
	// Optional lets the output be free text: the grammar binds only if
	// the output's first byte is '{' (the value then starts with it).
	Optional bool
}

// ErrBudget is wrapped by the refusal of a structured request whose
// max_tokens cannot hold the shortest value of its grammar.
var ErrBudget = errors.New("sched: max_tokens too small for the shortest structured value")

// GrammarError refuses a structured request at submission: its prefix
// does not follow the grammar, or (Err wraps ErrBudget) its max_tokens
// cannot hold the shortest value. It matches ErrInvalidRequest.
type GrammarError struct {
	ID  string
	Err error
}

func (e *GrammarError) Error() string {
	return fmt.Sprintf("sched: invalid request: request %q: structured output: %v", e.ID, e.Err)
}

func (e *GrammarError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrInvalidRequest) true.
func (e *GrammarError) Is(target error) bool { return target == ErrInvalidRequest }

// gramMode is where a structured sequence is: an optional grammar is
// undecided until the first output byte.
type gramMode uint8

const (
	gramBound     gramMode = iota // every byte follows the grammar
	gramUndecided                 // optional, no output byte yet
	gramFree                      // optional, the output did not start with '{'
)

// gramState is a structured sequence's grammar state after its first at
// output tokens: a pure function of those tokens.
type gramState struct {
	mode gramMode
	st   grammar.State
	at   int
}

func (g *Grammar) start() gramState {
	if g.Optional {
		return gramState{mode: gramUndecided, st: g.Automaton.Start()}
	}
	return gramState{mode: gramBound, st: g.Automaton.Start()}
}

// advance feeds output token id; false when the grammar refuses it. It is
// the one transition, for replay and delivery alike.
func (g *Grammar) advance(gs gramState, id int) (gramState, bool) {
	gs.at++
	p := g.Vocab.Piece(id)
	switch gs.mode {
	case gramFree:
		return gs, true
	case gramUndecided:
		switch {
		case len(p) == 0:
			return gs, true
		case p[0] != '{':
			gs.mode = gramFree
			return gs, true
		}
		gs.mode = gramBound
	}
	if id == g.Vocab.EOS() {
		return gs, g.Automaton.Accepting(gs.st)
	}
	if len(p) == 0 {
		return gs, false // a special token is never part of a value
	}
	var ok bool
	gs.st, ok = g.Automaton.Advance(gs.st, p)
	return gs, ok
}

// closed reports whether the structured value ended: nothing may follow.
func (g *Grammar) closed(gs gramState) bool {
	return gs.mode == gramBound && g.Automaton.Closed(gs.st)
}

// replay returns the state after the output tokens out.
func (g *Grammar) replay(out []int) (gramState, error) {
	gs := g.start()
	for i, id := range out {
		var ok bool
		if gs, ok = g.advance(gs, id); !ok {
			return gs, fmt.Errorf("output token %d (id %d) does not follow the grammar", i+1, id)
		}
	}
	return gs, nil
}

// admit checks a structured request and returns its state after Prefix:
// a bound grammar needs MinClose of that state within the tokens left.
func (g *Grammar) admit(r *Request) (gramState, error) {
	if g.Automaton == nil || g.Vocab == nil {
		return gramState{}, errors.New("structured output needs an automaton and a vocabulary")
	}
	gs, err := g.replay(r.Prefix)
	if err != nil {
		return gs, err
	}
	if g.closed(gs) {
		return gs, ErrPrefixFinished
	}
	left := r.MaxTokens - len(r.Prefix)
	if mc := g.Automaton.MinClose(gs.st); gs.mode == gramBound && mc > left {
		return gs, fmt.Errorf("%w: %d tokens left, the shortest value needs %d", ErrBudget, left, mc)
	}
	return gs, nil
}

// mask sets allowed to the tokens gs permits with remaining tokens left
// (this one included). It reports false for a free sequence (no mask).
func (g *Grammar) mask(gs gramState, remaining int, allowed []bool) bool {
	a, v := g.Automaton, g.Vocab
	switch gs.mode {
	case gramFree:
		return false
	case gramBound:
		a.MaskBudget(gs.st, v, allowed, remaining)
		return true
	}
	// Undecided: a token starting with '{' begins the value (only if the
	// value still fits in the budget); any other is free text.
	if a.MinClose(gs.st) <= remaining {
		a.MaskBudget(gs.st, v, allowed, remaining)
	} else {
		clear(allowed)
	}
	for id := range v.Size() {
		if p := v.Piece(id); len(p) == 0 || p[0] != '{' {
			allowed[id] = true
		}
	}
	return true
}
