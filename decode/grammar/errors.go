package grammar

import (
	"errors"
	"fmt"
)

// Sentinels wrapped by every *SchemaError, matched with errors.Is.
var (
	// ErrUnsupported: the schema uses a keyword (or a form of one) outside
	// the supported subset.
	ErrUnsupported = errors.New("grammar: unsupported schema keyword")
	// ErrInvalidSchema: the schema is not a well-formed schema of the subset
	// (wrong value types, unknown required property, empty enum, ...).
	ErrInvalidSchema = errors.New("grammar: invalid schema")
	// ErrTooLarge: the schema is nested deeper than MaxDepth, has more
	// than MaxNodes nodes, an enum of more than MaxEnumValues values, more
	// than MaxLiteralBytes of literals and property names, or a literal
	// trie too large for the automaton's positions.
	ErrTooLarge = errors.New("grammar: schema too large")
)

// SchemaError says which keyword at which place of the schema was refused.
// A frontend turns it into a 400 naming the request parameter.
type SchemaError struct {
	// Path is a JSON pointer to the schema object holding the keyword
	// ("" is the root).
	Path string
	// Keyword is the offending keyword, empty when the whole node is at
	// fault (depth, size, not an object).
	Keyword string
	Reason  string
	Err     error
}

func (e *SchemaError) Error() string {
	at := e.Path
	if at == "" {
		at = "/"
	}
	if e.Keyword == "" {
		return fmt.Sprintf("%v at %s: %s", e.Err, at, e.Reason)
	}
	return fmt.Sprintf("%v %q at %s: %s", e.Err, e.Keyword, at, e.Reason)
}

func (e *SchemaError) Unwrap() error { return e.Err }
