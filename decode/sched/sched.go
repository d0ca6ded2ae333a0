// Package sched is the reference engine's continuous-batching scheduler: it
// admits sequences under hard limits, reserves their KV blocks, and runs
// steps that mix prefill chunks and decode tokens of many sequences in one
// forward pass, interactive traffic first.
//
// The scheduler does no I/O of its own; Step is driven by Run or by a test.
package sched

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
)

// Limits are the scheduler's hard limits. Every one rejects at once with an
// *OverloadedError rather than waiting.
type Limits struct {
	// MaxRunning is the most sequences decoding at once.
	MaxRunning int
	// MaxQueued is the most admitted-but-waiting requests; 0 means a request
	// that cannot start at once is rejected.
	MaxQueued int
	// MaxStepTokens is the most positions computed in one step; prefills
	// longer than that are split into chunks.
	MaxStepTokens int
}

// Limits are the scheduler's limits.
func (s *Scheduler) Limits() Limits { return s.limits }

// DefaultLimits suit a small CPU engine.
var DefaultLimits = Limits{MaxRunning: 64, MaxQueued: 256, MaxStepTokens: 512}

// Scheduler owns the sequences of one engine instance.
type Scheduler struct {
	engine Engine
	// model is the reference model when it is the engine (New), else nil:
	// speculation needs it.
	model  *model.Model
	store  kvcache.Store
	limits Limits

	// stepMu serialises steps; mu guards everything else and is not held
	// during a forward pass. stepDone is signalled when a step commits.
	stepMu   sync.Mutex
	mu       sync.Mutex
	stepDone *sync.Cond
	samplers []*sample.Sampler
	queues   [numPriorities][]*sequence
	running  []*sequence
	// slots[i] is whether a running sequence holds slot i (engine.go).
	slots  []bool
	byID   map[string]*sequence
	closed bool
	wake   chan struct{}
	// freeErrors counts blocks the store refused to take back.
	freeErrors int
	// reusedPositions counts prompt positions whose K/V came from the store.
	reusedPositions int
	stepErrors      int
	// seenLosses is the store's loss count at the last revalidation;
	// recomputed counts sequences restarted because their blocks were lost.
	seenLosses uint64
	recomputed int
	generated  uint64
	// computed counts positions whose K/V a step computed; stepTimes are
	// the durations of the last steps (a ring), so that a health checker
	// sees progress without a token and knows how long a step takes.
	computed  uint64
	stepTimes [meanSteps]time.Duration
	stepCount int
	// spec is the draft side when speculative decoding is on (spec.go).
	spec *speculator
	// interval is the least time from one step's start to the next's
	// (SetStepInterval), in nanoseconds.
	interval atomic.Int64
}

// SetStepInterval makes Run start a step no sooner than d after the
// previous one started (0: at once), and Stats count a step as taking at
// least d. It is for tests and drills: a small model made as slow per
// token as a stream that must be cut mid-way needs, without a large
// model's computation. Safe while Run runs.
func (s *Scheduler) SetStepInterval(d time.Duration) { s.interval.Store(int64(max(d, 0))) }

// recentSteps is how many steps StepTime looks back over; meanSteps how
// many MeanStepTime averages.
const recentSteps, meanSteps = 16, 64

// New returns a scheduler that computes with m and keeps K/V in store.
func New(m *model.Model, store kvcache.Store, limits Limits) (*Scheduler, error) {
	if store.Layout() != m.KVLayout(store.Layout().BlockSize) {
		return nil, fmt.Errorf("sched: store layout %s does not fit model", store.Layout())
	}
	s, err := NewOn(&modelEngine{m: m}, store, limits)
	if s != nil {
		s.model = m
	}
	return s, err
}

// NewOn returns a scheduler that computes with e; store reserves each
// sequence's blocks (and holds their K/V if e keeps it there).
func NewOn(e Engine, store kvcache.Store, limits Limits) (*Scheduler, error) {
	if limits.MaxRunning <= 0 || limits.MaxQueued < 0 || limits.MaxStepTokens <= 0 {
		return nil, fmt.Errorf("%w: limits %+v: need MaxRunning > 0, MaxQueued >= 0, MaxStepTokens > 0", ErrInvalidRequest, limits)
	}
	s := &Scheduler{engine: e, store: store, limits: limits, byID: make(map[string]*sequence), wake: make(chan struct{}, 1)}
	s.stepDone = sync.NewCond(&s.mu)
	return s, nil
}

// Run steps until ctx is done, sleeping while there is no work. On return
// every remaining sequence is cancelled.
func (s *Scheduler) Run(ctx context.Context) error {
	defer s.Close()
	pace := time.NewTimer(0)
	defer pace.Stop()
	for {
		// A failed step has already ended the sequences in its batch (and
		// counted it); the others keep running.
		started := time.Now()
		busy, _ := s.Step()
		if busy {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if d := time.Duration(s.interval.Load()) - time.Since(started); d > 0 {
				pace.Reset(d)
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-pace.C:
				}
			}
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.wake:
		}
	}
}

// Close cancels every sequence and refuses further submissions.
func (s *Scheduler) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, seq := range slices.Collect(maps.Values(s.byID)) {
		s.cancelLocked(seq)
	}
}
