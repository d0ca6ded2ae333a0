package worker

import (
	"errors"
	"fmt"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/wire"
)

// TestErrorFrameTypes: each engine error reaches the frontend with the code
// and retryability that decide between migrating and failing.
func TestErrorFrameTypes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err       error
		code      wire.Code
		retryable bool
	}{
		{&sched.OverloadedError{Limit: sched.LimitKVBlocks}, wire.Code_OVERLOADED, true},
		{fmt.Errorf("%w: bad", sched.ErrInvalidRequest), wire.Code_INVALID_REQUEST, false},
		{sched.ErrTooLarge, wire.Code_TOO_LARGE, false},
		{sched.ErrCancelled, wire.Code_CANCELLED, false},
		{sched.ErrClosed, wire.Code_SHUTTING_DOWN, true},
		{fmt.Errorf("%w: %v", sched.ErrKVLost, &sched.OverloadedError{}), wire.Code_INTERNAL, true},
		{errors.New("disk on fire"), wire.Code_INTERNAL, false},
	} {
		if f := ErrorFrame(c.err); f.Code != c.code || f.Retryable != c.retryable {
			t.Errorf("%v: code %v retryable %v, want %v %v", c.err, f.Code, f.Retryable, c.code, c.retryable)
		}
	}
}
