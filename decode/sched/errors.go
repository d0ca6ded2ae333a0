package sched

import (
	"errors"
	"fmt"
)

var (
	// ErrOverloaded matches every *OverloadedError.
	ErrOverloaded = errors.New("sched: overloaded")
	// ErrTooLarge means the request needs more KV blocks than the whole
	// store holds: retrying cannot help.
	ErrTooLarge = errors.New("sched: request needs more KV blocks than the store holds")
	// ErrCancelled is the error of a sequence that was cancelled.
	ErrCancelled = errors.New("sched: cancelled")
	// ErrUnknownSequence is returned by Cancel for an id that is not queued
	// or running.
	ErrUnknownSequence = errors.New("sched: unknown sequence")
	// ErrInvalidRequest is wrapped by every request validation error.
	ErrInvalidRequest = errors.New("sched: invalid request")
	// ErrClosed is returned by Submit after Close.
	ErrClosed = errors.New("sched: closed")
	// ErrKVLost ends a sequence whose KV blocks were taken back and could
	// not be replaced; the request can be retried or migrated.
	ErrKVLost = errors.New("sched: KV blocks lost")
	// ErrPrefixFinished refuses a continuation whose prefix already ended
	// the sequence (a structured value closed by its last token): the
	// caller finishes it with FinishStop instead of generating.
	ErrPrefixFinished = errors.New("sched: the prefix already ends the sequence")
	// ErrNoAllowedToken ends a structured sequence whose grammar allowed
	// no token of the vocabulary (one without single-byte tokens).
	ErrNoAllowedToken = errors.New("sched: the grammar allows no token of the vocabulary")
)

// Limit names the hard limit that rejected a request.
type Limit string

const (
	LimitRunning  Limit = "running"
	LimitQueued   Limit = "queued"
	LimitKVBlocks Limit = "kv_blocks"
	// LimitCanary: a canary is already running.
	LimitCanary Limit = "canary"
)

// OverloadedError is the typed, retryable rejection of a request that hit a
// hard limit. Nothing was queued; the caller may retry later or elsewhere.
type OverloadedError struct {
	Limit      Limit
	Running    int
	Queued     int
	FreeBlocks int
	NeedBlocks int
}

func (e *OverloadedError) Error() string {
	return fmt.Sprintf("sched: overloaded: %s limit reached (running %d, queued %d, free KV blocks %d, needed %d)",
		e.Limit, e.Running, e.Queued, e.FreeBlocks, e.NeedBlocks)
}

// Is makes errors.Is(err, ErrOverloaded) true.
func (e *OverloadedError) Is(target error) bool { return target == ErrOverloaded }

// Retryable reports that the request may succeed if sent again.
func (e *OverloadedError) Retryable() bool { return true }
