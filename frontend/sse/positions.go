package sse

import (
	"errors"
	"strconv"
	"strings"
)

// A stream of several choices (n > 1, or a batch of prompts) gives every
// event an id that holds one position per choice, joined by dots
// ("3.7.5"): the last event's id alone tells where each choice is, which
// is all Last-Event-ID carries. A choice's position is the sequence number
// of its last token delivered, or one past its last token once its finish
// chunk was delivered. A stream of one choice keeps plain sequence
// numbers.

// ErrPosition is wrapped by every malformed position.
var ErrPosition = errors.New("sse: malformed position")

// maxPosition bounds one position (a sequence number is an int32).
const maxPosition = 1<<31 - 1

// FormatPositions is the event id of positions: a plain sequence number for
// one choice, dot-separated positions for several.
func FormatPositions(pos []int) string {
	var b strings.Builder
	for i, p := range pos {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(strconv.Itoa(p))
	}
	return b.String()
}

// ParsePositions reads an event id of a stream of k choices strictly:
// exactly k positions, digits only (no sign, no spaces, no empty part),
// each at most 2^31-1. "" is every choice at its start.
func ParsePositions(s string, k int) ([]int, error) {
	pos := make([]int, k)
	if s == "" {
		return pos, nil
	}
	parts := strings.Split(s, ".")
	if len(parts) != k {
		return nil, errPosition(s, "want "+strconv.Itoa(k)+" positions")
	}
	for i, p := range parts {
		if p == "" || len(p) > 10 {
			return nil, errPosition(s, "not a sequence number")
		}
		for _, c := range []byte(p) {
			if c < '0' || c > '9' {
				return nil, errPosition(s, "not a sequence number")
			}
		}
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n > maxPosition {
			return nil, errPosition(s, "not a sequence number")
		}
		pos[i] = int(n)
	}
	return pos, nil
}

type positionError struct{ s, why string }

func (e *positionError) Error() string { return strconv.Quote(e.s) + ": " + e.why }
func (e *positionError) Unwrap() error { return ErrPosition }

func errPosition(s, why string) error { return &positionError{s, why} }
