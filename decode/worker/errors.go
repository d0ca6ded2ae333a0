package worker

import (
	"errors"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/collective"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/wire"
)

// ErrorFrame renders an engine error as a typed wire error.
func ErrorFrame(err error) *wire.Error {
	e := &wire.Error{Code: wire.Code_INTERNAL, Message: err.Error()}
	var oe *sched.OverloadedError
	switch {
	case errors.As(err, &oe):
		e.Code, e.Retryable = wire.Code_OVERLOADED, true
	case errors.Is(err, decode.ErrInvalidRequest), errors.Is(err, sched.ErrInvalidRequest):
		e.Code = wire.Code_INVALID_REQUEST
	case errors.Is(err, sched.ErrTooLarge):
		e.Code = wire.Code_TOO_LARGE
	case errors.Is(err, sched.ErrCancelled):
		e.Code = wire.Code_CANCELLED
	case errors.Is(err, sched.ErrClosed):
		e.Code, e.Retryable = wire.Code_SHUTTING_DOWN, true
	case errors.Is(err, sched.ErrKVLost):
		// Blocks taken back and not replaceable here: another worker can
		// continue (migrate), this one could not.
		e.Retryable = true
	case errors.Is(err, collective.ErrAborted), errors.Is(err, collective.ErrTimeout):
		// A rank of this tensor-parallel group died or stalls: the group
		// is going, another instance continues the request.
		e.Code, e.Retryable = wire.Code_SHUTTING_DOWN, true
	}
	return e
}
