package frontend

import (
	"strconv"

	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// This file reads resume positions: Last-Event-ID or ?starting_after, a
// sequence number for a request of one choice, one per choice
// (sse.FormatPositions) for a request of several.

// parsePosition reads a resume position (Last-Event-ID, starting_after):
// digits only, no sign, no trailing bytes; "" is 0.
func parsePosition(s string) (int, *ParamError) {
	if s == "" {
		return 0, nil
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, invalid("Last-Event-ID", "%q is not a sequence number", s)
		}
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return 0, invalid("Last-Event-ID", "%q is not a sequence number", s)
	}
	return int(n), nil
}

// parsePositions reads the resume position of a request of k > 1
// choices: exactly k dot-separated sequence numbers, or "".
func parsePositions(s string, k int) ([]int, *ParamError) {
	pos, err := sse.ParsePositions(s, k)
	if err != nil {
		return nil, invalid("Last-Event-ID", "%v: want %d dot-separated sequence numbers, one per choice", err, k)
	}
	return pos, nil
}
