// Package reqfsm holds the frontend's decisions about a request as pure
// state machines in the manner of etcd's raft: the request machine
// (Request: admission to completion, migration under request epochs,
// cancellation, waits for capacity, the retry budget it spends), the
// takeover of another frontend's request at a new owner term, and the
// token log a request commits to. Events go in with the time they
// happened; Actions come out for the caller (package frontend's run) to
// carry out. Nothing here does I/O, starts a goroutine or reads a
// clock, and it imports only the standard library, frontend/route and
// contract leaves (tools/checks holds it to that), so that every
// decision is tested alone, in microseconds.
package reqfsm

import (
	"errors"
	"fmt"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/openai"
)

// State is a request's state in the request state machine.
type State int

const (
	Admitted State = iota
	Prefilling
	Transferring
	Decoding
	Completed
	Migrating
	Cancelling
	Cancelled
	Failed
)

var stateNames = [...]string{"ADMITTED", "PREFILLING", "TRANSFERRING", "DECODING", "COMPLETED", "MIGRATING", "CANCELLING", "CANCELLED", "FAILED"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Terminal reports whether nothing can happen to the request any more.
func (s State) Terminal() bool { return s == Completed || s == Cancelled || s == Failed }

func (s State) running() bool {
	return s == Admitted || s == Prefilling || s == Transferring || s == Decoding || s == Migrating
}

// RequestError is a request's terminal, typed error.
type RequestError struct {
	Type    openai.ErrorType
	Message string
}

func (e *RequestError) Error() string { return string(e.Type) + ": " + e.Message }

// Is makes errors.Is match on the type: a target that is an ErrorType,
// or another *RequestError of the same type.
func (e *RequestError) Is(target error) bool {
	if t, ok := target.(openai.ErrorType); ok {
		return t == e.Type
	}
	var t *RequestError
	return errors.As(target, &t) && t.Type == e.Type
}

// Endpoint is one worker instance at one generation.
type Endpoint struct {
	InstanceID string
	Generation uint64
}

// Token is one committed output token.
type Token struct {
	SequenceNo int // 1-based
	ID         int
	Text       string
	// Logprobs are the token's log-probabilities, when the request asked
	// for them: kept in the log, so a resume replays them unchanged.
	Logprobs *TokenLogprobs
	Instance string // who produced it, for the client's information
}

// Policy bounds recovery.
type Policy struct {
	// MigrationBudget is the most migrations of one request (default 3).
	MigrationBudget int
	// StallTimeout: a worker that sends nothing for this long is treated as
	// failed (a zombie can hold a connection open and send nothing).
	StallTimeout time.Duration
	// GoneSilence is the stall timeout of a decoding endpoint whose
	// registration is gone (its lease expired, e.g. its node cut off):
	// nothing renews it, so its silence is not waited out for
	// StallTimeout. A stream still coming (the data plane needs no etcd)
	// is never moved. 0: none.
	GoneSilence time.Duration
	// PrefillPerToken estimates re-prefill time, to tell whether the
	// deadline still covers a migration.
	PrefillPerToken time.Duration
	// CapacityWait bounds how long a request (or a migration) that finds
	// no routable instance waits for one to register before it fails
	// with no_capacity; 0 fails at once.
	CapacityWait time.Duration
	// Retries is the frontend's retry budget that re-routes after an
	// overload refusal and migrations spend from (nil: unlimited). Per
	// request, migrations are bounded by MigrationBudget and re-routes by
	// the instances (each refusing one is excluded); the deadline is the
	// request's, kept across every retry.
	Retries *RetryBudget
}

// DefaultCapacityWait is Policy.CapacityWait unless configured otherwise.
const DefaultCapacityWait = 15 * time.Second

// DefaultPolicy is the recovery policy unless configured otherwise.
var DefaultPolicy = Policy{MigrationBudget: 3, StallTimeout: 10 * time.Second, GoneSilence: 2 * time.Second, PrefillPerToken: 2 * time.Millisecond, CapacityWait: DefaultCapacityWait}

// Request is one request's state and token log. The prompt and committed
// output tokens are the facts a migration continues from.
type Request struct {
	ID        string
	Prompt    []int
	MaxTokens int
	Deadline  time.Time
	Policy    Policy

	State State
	// Epoch is bumped on every change of who may produce tokens (migrate,
	// cancel); frames of an older epoch are dropped.
	Epoch    uint64
	Endpoint Endpoint
	// Output holds the committed tokens: Output.At(i).SequenceNo == i+1.
	Output     TokenLog
	Migrations int
	// FailedInstances lists every instance that failed this request, and
	// FailedGenerations the generation it failed at: a migration never
	// goes back to such an endpoint (a restart, at a higher generation,
	// is another one).
	FailedInstances   map[string]bool
	FailedGenerations map[string]uint64
	Err               *RequestError
	FinishReason      string
	// LastFailure is the reason of the last worker failure the request
	// acted on, those it found itself (a stall) included.
	LastFailure string
	lastFrame   time.Time
	// gone are endpoints of this request whose registration vanished
	// (OnDeregistered): their silence counts against GoneSilence.
	gone []Endpoint
	// retryPending: the next route is a re-route after an overload
	// refusal, paid from the retry budget.
	retryPending bool
	// CapacityWaited is how long the request waited for an instance to
	// register, over all its routes.
	CapacityWaited time.Duration
	// waitingSince is when the current wait for capacity began (zero
	// when the request is not waiting).
	waitingSince time.Time
	// drainMigration: the migration under way is from a worker whose node
	// drains (a DRAINING error); with no route it ends at once (draining).
	drainMigration bool

	// P/D split: the prefill instance working for the current epoch, how
	// many prefill instances failed this request, and the epoch of the
	// current KV transfer.
	PrefillAt       Endpoint
	PrefillFailures int
	TransferEpoch   uint64

	// Counters for metrics.
	StaleEpochFrames int
	DuplicateFrames  int
	Gaps             int
	StaleTransfers   int

	// How the KV of the serving attempt came about: ReusedPositions were
	// read from the arena instead of computed (from the worker's finish
	// frame); PD is the P/D hand-off path ("" when not split);
	// TransferBytes were pulled between nodes for it.
	ReusedPositions int
	PD              string
	TransferBytes   uint64
}

// NewRequest admits a request at epoch 1.
func NewRequest(id string, prompt []int, maxTokens int, deadline time.Time, p Policy, now time.Time) *Request {
	return &Request{ID: id, Prompt: prompt, MaxTokens: maxTokens, Deadline: deadline, Policy: p, State: Admitted, Epoch: 1,
		FailedInstances: map[string]bool{}, FailedGenerations: map[string]uint64{}, lastFrame: now}
}

// Received is the highest committed sequence number: migration resumes
// after it.
func (r *Request) Received() int { return r.Output.Len() }
