// Package openai holds the frontend's API vocabulary as a leaf: the
// error kinds of OpenAI-shaped error bodies (ErrorType, the stable
// `type` a client switches on). Each kind is an error value, so that
// errors.Is(err, openai.ErrOverloaded) asks whether a request ended
// with it. It imports nothing but the standard library.
package openai

// ErrorType is the stable `type` of an OpenAI-shaped error body. It is
// an error itself, so that errors.Is(err, ErrOverloaded) asks whether a
// request ended with that type.
type ErrorType string

func (t ErrorType) Error() string { return string(t) }

const (
	ErrInvalidRequest     ErrorType = "invalid_request_error"
	ErrOverloaded         ErrorType = "overloaded"
	ErrNoCapacity         ErrorType = "no_capacity"
	ErrMigrationExhausted ErrorType = "migration_exhausted"
	ErrDeadlineExceeded   ErrorType = "deadline_exceeded"
	ErrCancelledType      ErrorType = "cancelled"
	// ErrFrontendStopping ends the requests of a frontend that stops: the
	// client did not cancel them, and may retry elsewhere.
	ErrFrontendStopping ErrorType = "frontend_stopping"
)

// ErrDraining ends a request whose node drains when no other instance
// serves its model: the node is going away, the client may retry (503,
// Retry-After) once it or another is back.
const ErrDraining ErrorType = "draining"

// ErrRetryBudget ends a request whose retry (a re-route after an overload
// refusal, or a migration) the frontend's retry budget refused: the
// cluster is overloaded or failing, and retrying would multiply the load.
// 429 with Retry-After before anything is streamed.
const ErrRetryBudget ErrorType = "retry_budget_exhausted"

// ErrTakenOver ends a request another frontend took over: the client
// resumes at the new owner (its URL is in the error event and in the
// Lifeline-Owner-URL header of a 409).
const ErrTakenOver ErrorType = "taken_over"

// ErrTakeoverUnavailable answers a resume that needs a takeover while
// etcd does not answer: retryable, nothing was driven.
const ErrTakeoverUnavailable ErrorType = "takeover_unavailable"

// ErrBadRequestRecord answers a resume whose request record cannot be
// read (it is malformed).
const ErrBadRequestRecord ErrorType = "bad_request_record"

// ErrRecordsFull refuses a request, before anything is streamed, while
// the frontend's request records are at their bound (--record-bytes-max).
const ErrRecordsFull ErrorType = "records_full"

// ErrTooEarly is the type of a 425 answer: a request that came as 0-RTT
// early data and is not an idempotent read.
const ErrTooEarly ErrorType = "too_early"

// ErrOutputNotKept is the error of a replay of a request whose output
// did not fit its record.
const ErrOutputNotKept ErrorType = "output_not_kept"
