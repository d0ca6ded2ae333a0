package frontend

import (
	"errors"
	"fmt"
	"testing"

	"github.com/lifeline-llm/lifeline/frontend/openai"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
)

// TestErrorTypesWorkWithErrorsIs: a request's terminal error matches
// its type with errors.Is, wrapped or not, and no other type; the type
// prints as the string clients see.
func TestErrorTypesWorkWithErrorsIs(t *testing.T) {
	err := fmt.Errorf("route: %w", &reqfsm.RequestError{Type: openai.ErrOverloaded, Message: "every instance is at its limit"})
	switch {
	case !errors.Is(err, openai.ErrOverloaded):
		t.Errorf("errors.Is(%v, ErrOverloaded) is false", err)
	case errors.Is(err, openai.ErrNoCapacity):
		t.Errorf("errors.Is(%v, ErrNoCapacity) is true", err)
	case !errors.Is(err, &reqfsm.RequestError{Type: openai.ErrOverloaded}):
		t.Errorf("a *RequestError of the same type no longer matches")
	case fmt.Sprintf("%v %s %q", openai.ErrOverloaded, openai.ErrOverloaded, openai.ErrOverloaded) != `overloaded overloaded "overloaded"`:
		t.Errorf("ErrOverloaded prints as %v", openai.ErrOverloaded)
	}
}
