package openai

import (
	"errors"
	"fmt"
	"testing"
)

// every kind, as clients see them.
var kinds = []ErrorType{ErrInvalidRequest, ErrOverloaded, ErrNoCapacity, ErrMigrationExhausted, ErrDeadlineExceeded,
	ErrCancelledType, ErrFrontendStopping, ErrDraining, ErrRetryBudget, ErrTakenOver, ErrTakeoverUnavailable,
	ErrBadRequestRecord, ErrRecordsFull, ErrTooEarly, ErrOutputNotKept}

// TestKindsAreDistinctErrors: each kind is a non-empty, distinct `type`
// string, and as an error matches itself, wrapped or not, and no other.
func TestKindsAreDistinctErrors(t *testing.T) {
	seen := map[ErrorType]bool{}
	for _, k := range kinds {
		if k == "" || seen[k] {
			t.Fatalf("kind %q empty or listed twice", k)
		}
		seen[k] = true
		wrapped := fmt.Errorf("request r: %w", k)
		for _, other := range kinds {
			if got := errors.Is(wrapped, other); got != (other == k) {
				t.Errorf("errors.Is(%v, %v) = %v", wrapped, other, got)
			}
		}
		if k.Error() != string(k) {
			t.Errorf("%q prints as %q", string(k), k.Error())
		}
	}
}
