package sse

import (
	"errors"
	"slices"
	"testing"
)

// TestPositions: the event id of several choices round-trips, and a
// malformed one or one of the wrong arity is refused.
func TestPositions(t *testing.T) {
	for _, pos := range [][]int{{0, 0}, {3, 7, 5}, {1}, {2147483647, 0, 1, 2}} {
		got, err := ParsePositions(FormatPositions(pos), len(pos))
		if err != nil || !slices.Equal(got, pos) {
			t.Fatalf("%v: %v %v", pos, got, err)
		}
	}
	if got := FormatPositions([]int{17}); got != "17" {
		t.Fatalf("one choice: %q, want a plain sequence number", got)
	}
	if got, err := ParsePositions("", 3); err != nil || !slices.Equal(got, []int{0, 0, 0}) {
		t.Fatalf("empty: %v %v", got, err)
	}
	for _, c := range []struct {
		s string
		k int
	}{{"3.7", 3}, {"3.7.5.1", 3}, {"3", 2}, {"3..5", 3}, {"3.7.", 3}, {".3.7", 3}, {"-1.2", 2}, {"+1.2", 2}, {"1 .2", 2}, {"1.2;DROP", 2},
		{"0x1.2", 2}, {"1e3.2", 2}, {"2147483648.0", 2}, {"99999999999.0", 2}, {"1,2", 2}} {
		if _, err := ParsePositions(c.s, c.k); !errors.Is(err, ErrPosition) {
			t.Fatalf("%q (k=%d) accepted: %v", c.s, c.k, err)
		}
	}
}
