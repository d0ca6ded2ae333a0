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
	"runtime"
	"slices"
	"sync"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
)

// Priority is a request's class. Interactive sequences are admitted and
// scheduled before batch ones.
type Priority int

const (
	Interactive Priority = iota
	Batch
	// Canary is the health-check lane: it never queues behind traffic. One
	// canary runs at a time outside MaxRunning, on KV blocks held back for
	// it; a second is rejected at once.
	Canary
	numPriorities
)

// CanaryMaxPositions bounds a canary's prompt plus output, so that the
// blocks held back for it always suffice.
const CanaryMaxPositions = 16

// rank orders priorities for scheduling: canary, interactive, batch.
func (p Priority) rank() int {
	if p == Canary {
		return -1
	}
	return int(p)
}

// FinishReason says why a sequence ended.
type FinishReason string

const (
	FinishStop      FinishReason = "stop"
	FinishLength    FinishReason = "length"
	FinishCancelled FinishReason = "cancelled"
	FinishError     FinishReason = "error"
	// FinishPrefilled ends a prefill-only request: its prompt's K/V are
	// computed and its full blocks offered to the shared store.
	FinishPrefilled FinishReason = "prefilled"
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

// DefaultLimits suit a small CPU engine.
var DefaultLimits = Limits{MaxRunning: 64, MaxQueued: 256, MaxStepTokens: 512}

// Token is one generated output token.
type Token struct {
	// SequenceNo is the 1-based output position; with a prefix of k prior
	// output tokens the first new token is k+1.
	SequenceNo int
	ID         int
	// Logits of this position, when the request asked to keep them.
	Logits []float32
	// Last is set when this token ends the sequence by itself (a stop token
	// or the max_tokens budget).
	Last bool
}

// Finish ends a sequence. Err is ErrCancelled for a cancel and the step
// error for FinishError.
type Finish struct {
	Reason    FinishReason
	Generated int
	// ReusedPositions were taken from a shared KV store, not computed.
	ReusedPositions int
	Err             error
}

// Request is one sequence to generate.
type Request struct {
	ID string
	// Prompt includes BOS.
	Prompt []int
	// Prefix are output tokens already generated (by an earlier attempt);
	// generation continues after them and they count towards MaxTokens.
	Prefix []int
	// MaxTokens is the total output budget, Prefix included.
	MaxTokens  int
	Sampling   sample.Params
	StopTokens []int
	Priority   Priority
	KeepLogits bool
	// PrefillOnly computes the prompt's K/V (publishing its full blocks
	// where the store shares them) and finishes with FinishPrefilled
	// without sampling: the prefill half of a P/D split.
	PrefillOnly bool
	// OnToken is called from the stepping goroutine for every new token;
	// returning false ends the sequence with FinishStop. OnFinish is called
	// exactly once. Neither may block or call back into the scheduler.
	OnToken  func(Token) bool
	OnFinish func(Finish)
}

type sequence struct {
	req      Request
	tokens   []int // prompt then every output token
	computed int   // positions whose K/V are written
	// published counts leading blocks that are shared: reused from the
	// store or offered to it after being computed.
	published int
	reused    int // positions whose K/V came from the store
	// inFlight is set while a step computes the sequence; cancelled asks
	// that step to end it; finished is set once OnFinish ran.
	inFlight, cancelled, finished bool
	blocks                        []kvcache.BlockID
	logits                        []float32
	nOutput                       int
}

// Scheduler owns the sequences of one engine instance.
type Scheduler struct {
	model  *model.Model
	store  kvcache.Store
	limits Limits

	// stepMu serialises steps; mu guards everything else and is not held
	// during a forward pass. stepDone is signalled when a step commits.
	stepMu   sync.Mutex
	mu       sync.Mutex
	stepDone *sync.Cond
	ws       model.Workspace
	samplers []*sample.Sampler
	queues   [numPriorities][]*sequence
	running  []*sequence
	byID     map[string]*sequence
	closed   bool
	wake     chan struct{}
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
}

// New returns a scheduler that computes with m and keeps K/V in store.
func New(m *model.Model, store kvcache.Store, limits Limits) (*Scheduler, error) {
	if limits.MaxRunning <= 0 || limits.MaxQueued < 0 || limits.MaxStepTokens <= 0 {
		return nil, fmt.Errorf("%w: limits %+v: need MaxRunning > 0, MaxQueued >= 0, MaxStepTokens > 0", ErrInvalidRequest, limits)
	}
	if store.Layout() != m.KVLayout(store.Layout().BlockSize) {
		return nil, fmt.Errorf("sched: store layout %s does not fit model", store.Layout())
	}
	s := &Scheduler{model: m, store: store, limits: limits, byID: make(map[string]*sequence), wake: make(chan struct{}, 1)}
	s.stepDone = sync.NewCond(&s.mu)
	return s, nil
}

// Stats is a snapshot of the scheduler's load.
type Stats struct {
	Running, Queued, FreeBlocks, TotalBlocks int
	FreeErrors                               int
	// ReusedPositions counts positions whose K/V came from a shared store
	// instead of being computed.
	ReusedPositions int
	// StepErrors counts forward passes that failed (their batch ended).
	StepErrors int
	// Recomputed counts sequences recomputed after their KV blocks were
	// taken back.
	Recomputed int
	// Generated counts every token sampled since the scheduler started.
	Generated uint64
}

// Stats returns the current load.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Running: len(s.running), Queued: s.queuedLocked(), FreeBlocks: s.store.NumFree(), TotalBlocks: s.store.Capacity(), FreeErrors: s.freeErrors, ReusedPositions: s.reusedPositions, StepErrors: s.stepErrors, Recomputed: s.recomputed, Generated: s.generated}
}

func (s *Scheduler) queuedLocked() int {
	n := 0
	for _, q := range s.queues {
		n += len(q)
	}
	return n
}

// blocksFor is the number of blocks a request reserves: every position up to
// the last one whose K/V is computed (the final token is never fed back).
func (s *Scheduler) blocksFor(r *Request) int {
	positions := len(r.Prompt) + r.MaxTokens - 1
	if r.PrefillOnly {
		positions = len(r.Prompt)
	}
	bs := s.store.Layout().BlockSize
	return (positions + bs - 1) / bs
}

func (s *Scheduler) validate(r *Request) error {
	c := s.model.Config
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: request %q: %s", ErrInvalidRequest, r.ID, fmt.Sprintf(format, args...))
	}
	switch {
	case r.ID == "":
		return bad("empty id")
	case len(r.Prompt) == 0:
		return bad("empty prompt")
	case r.MaxTokens <= 0:
		return bad("max_tokens %d must be positive", r.MaxTokens)
	case len(r.Prefix) >= r.MaxTokens:
		return bad("prefix of %d tokens leaves nothing to generate within max_tokens %d", len(r.Prefix), r.MaxTokens)
	case r.MaxTokens > c.ContextLen-len(r.Prompt):
		return bad("prompt of %d tokens plus max_tokens %d exceeds the context of %d", len(r.Prompt), r.MaxTokens, c.ContextLen)
	case r.Priority < 0 || r.Priority >= numPriorities:
		return bad("priority %d", r.Priority)
	case r.Priority == Canary && len(r.Prompt)+r.MaxTokens > CanaryMaxPositions:
		return bad("a canary may use at most %d positions", CanaryMaxPositions)
	case r.OnToken == nil || r.OnFinish == nil:
		return bad("OnToken and OnFinish are required")
	case r.PrefillOnly && len(r.Prefix) > 0:
		// A prefill hands off the prompt's blocks; a continuation is a
		// decode's work (its blocks would not be reserved here).
		return bad("prefill_only takes no prefix tokens")
	}
	for _, ids := range [][]int{r.Prompt, r.Prefix} {
		for _, id := range ids {
			if id < 0 || id >= c.VocabSize {
				return bad("token %d outside the vocabulary of %d", id, c.VocabSize)
			}
		}
	}
	for _, id := range r.Prefix {
		if slices.Contains(r.StopTokens, id) {
			return bad("prefix contains stop token %d", id)
		}
	}
	if err := r.Sampling.Validate(); err != nil {
		return bad("%v", err)
	}
	return nil
}

// Submit admits a request, starting it at once when a slot and its KV
// blocks are free and queueing it otherwise. When neither is possible it
// returns an *OverloadedError and changes nothing.
func (s *Scheduler) Submit(r Request) error {
	if err := s.validate(&r); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if _, dup := s.byID[r.ID]; dup {
		return fmt.Errorf("%w: request %q: id already in use", ErrInvalidRequest, r.ID)
	}
	need := s.blocksFor(&r)
	if need > s.store.Capacity() {
		return fmt.Errorf("%w: request %q needs %d blocks of %d", ErrTooLarge, r.ID, need, s.store.Capacity())
	}
	seq := &sequence{req: r, tokens: slices.Concat(r.Prompt, r.Prefix), nOutput: len(r.Prefix)}
	if r.Priority == Canary {
		if s.canaryRunningLocked() {
			return &OverloadedError{Limit: LimitCanary, Running: len(s.running), Queued: s.queuedLocked(), FreeBlocks: s.store.NumFree(), NeedBlocks: need}
		}
		if err := s.startLocked(seq, need); err != nil {
			return err
		}
	} else if s.queuedLocked() == 0 && s.regularRunningLocked() < s.limits.MaxRunning && s.store.NumFree()-s.canaryReserveLocked() >= need {
		if err := s.startLocked(seq, need); err != nil {
			return err
		}
	} else if s.queuedLocked() < s.limits.MaxQueued {
		s.queues[r.Priority] = append(s.queues[r.Priority], seq)
	} else {
		limit := LimitQueued
		if s.limits.MaxQueued == 0 {
			limit = LimitKVBlocks
			if s.regularRunningLocked() >= s.limits.MaxRunning {
				limit = LimitRunning
			}
		}
		return &OverloadedError{Limit: limit, Running: len(s.running), Queued: s.queuedLocked(), FreeBlocks: s.store.NumFree(), NeedBlocks: need}
	}
	s.byID[r.ID] = seq
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

func (s *Scheduler) startLocked(seq *sequence, need int) error {
	if err := s.reserveLocked(seq, need); err != nil {
		return err
	}
	s.running = append(s.running, seq)
	return nil
}

// reserveLocked gives seq its blocks: the longest shared prefix, then
// fresh blocks up to need. On failure it holds nothing and the error is a
// retryable *OverloadedError.
func (s *Scheduler) reserveLocked(seq *sequence, need int) error {
	seq.blocks, seq.computed, seq.published = nil, 0, 0
	if sh, ok := s.store.(kvcache.Sharing); ok {
		// The last prompt position is always computed: its logits pick
		// the first new token.
		bs := s.store.Layout().BlockSize
		seq.blocks = sh.AcquirePrefix(seq.tokens, (len(seq.tokens)-1)/bs)
		seq.computed = len(seq.blocks) * bs
		seq.published = len(seq.blocks)
	}
	for len(seq.blocks) < need {
		id, err := s.store.Alloc()
		if err != nil {
			s.freeLocked(seq)
			seq.computed, seq.published = 0, 0
			return &OverloadedError{Limit: LimitKVBlocks, Running: len(s.running), Queued: s.queuedLocked(), FreeBlocks: s.store.NumFree(), NeedBlocks: need}
		}
		seq.blocks = append(seq.blocks, id)
	}
	seq.reused += seq.computed
	s.reusedPositions += seq.computed
	return nil
}

// revalidateLocked recomputes, from its tokens, every sequence that holds a
// block the store took back (a shared arena whose lease lapsed): KV is
// derived state, the tokens are the facts. A sequence that cannot get
// blocks again ends with ErrKVLost.
func (s *Scheduler) revalidateLocked() {
	v, ok := s.store.(kvcache.Validator)
	if !ok {
		return
	}
	if losses := v.Losses(); losses == s.seenLosses {
		return
	} else {
		s.seenLosses = losses
	}
	for _, seq := range slices.Clone(s.running) {
		if !slices.ContainsFunc(seq.blocks, func(id kvcache.BlockID) bool { return !v.Valid(id) }) {
			continue
		}
		s.recomputed++
		need := s.blocksFor(&seq.req)
		s.freeLocked(seq)
		if err := s.reserveLocked(seq, need); err != nil {
			s.finishLocked(seq, Finish{Reason: FinishError, Err: fmt.Errorf("%w: %v", ErrKVLost, err)})
		}
	}
}

// publish offers the sequence's newly completed blocks for reuse. It runs
// outside the lock, while the sequence is in flight.
func (s *Scheduler) publish(seq *sequence) {
	sh, ok := s.store.(kvcache.Sharing)
	if !ok {
		return
	}
	bs := s.store.Layout().BlockSize
	for ; seq.published < seq.computed/bs; seq.published++ {
		parent := kvcache.NoBlock
		if seq.published > 0 {
			parent = seq.blocks[seq.published-1]
		}
		sh.Publish(seq.blocks[seq.published], parent, seq.tokens[:(seq.published+1)*bs])
	}
}

func (s *Scheduler) freeLocked(seq *sequence) {
	for _, id := range seq.blocks {
		// A block we allocated is ours to free; a failure means the store
		// changed under us. Count it rather than take the engine down.
		if err := s.store.Free(id); err != nil {
			s.freeErrors++
		}
	}
	seq.blocks = nil
}

func (s *Scheduler) canaryRunningLocked() bool {
	return slices.ContainsFunc(s.running, func(q *sequence) bool { return q.req.Priority == Canary })
}

func (s *Scheduler) regularRunningLocked() int {
	n := len(s.running)
	if s.canaryRunningLocked() {
		n--
	}
	return n
}

// canaryReserveLocked is the number of free blocks regular traffic must
// leave for a canary that is not running yet.
func (s *Scheduler) canaryReserveLocked() int {
	if s.canaryRunningLocked() {
		return 0
	}
	bs := s.store.Layout().BlockSize
	return (CanaryMaxPositions + bs - 1) / bs
}

// admitLocked starts queued requests in priority order while slots and
// blocks last; it stops at the first that does not fit so that a large
// interactive request is not overtaken forever.
func (s *Scheduler) admitLocked() {
	for p := range s.queues {
		for len(s.queues[p]) > 0 && s.regularRunningLocked() < s.limits.MaxRunning {
			seq := s.queues[p][0]
			need := s.blocksFor(&seq.req)
			if s.store.NumFree()-s.canaryReserveLocked() < need {
				return
			}
			if err := s.startLocked(seq, need); err != nil {
				return
			}
			s.queues[p] = s.queues[p][1:]
		}
	}
}

// Cancel ends a queued or running sequence and frees its blocks before it
// returns.
func (s *Scheduler) Cancel(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq, ok := s.byID[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownSequence, id)
	}
	s.cancelLocked(seq)
	return nil
}

// cancelLocked ends seq; if a step is computing it, it waits for that step,
// which ends it, so that its blocks are free when this returns.
func (s *Scheduler) cancelLocked(seq *sequence) {
	if seq.inFlight {
		seq.cancelled = true
		for seq.inFlight {
			s.stepDone.Wait()
		}
	}
	if !seq.finished {
		s.finishLocked(seq, Finish{Reason: FinishCancelled, Err: ErrCancelled})
	}
}

func (s *Scheduler) finishLocked(seq *sequence, f Finish) {
	if seq.finished {
		return
	}
	seq.finished = true
	s.freeLocked(seq)
	delete(s.byID, seq.req.ID)
	s.running = slices.DeleteFunc(s.running, func(x *sequence) bool { return x == seq })
	q := &s.queues[seq.req.Priority]
	*q = slices.DeleteFunc(*q, func(x *sequence) bool { return x == seq })
	f.Generated = seq.nOutput - len(seq.req.Prefix)
	f.ReusedPositions = seq.reused
	seq.req.OnFinish(f)
}

// Step admits what fits and runs one forward pass over the running
// sequences. It reports whether there was anything to do. The scheduler's
// lock is not held during the forward pass and sampling, so Submit, Stats
// and Cancel of sequences outside the batch answer at once; Cancel of a
// sequence inside the batch waits for the step to end, because its blocks
// are being written.
func (s *Scheduler) Step() (bool, error) {
	s.stepMu.Lock()
	defer s.stepMu.Unlock()

	s.mu.Lock()
	s.revalidateLocked()
	s.admitLocked()
	if len(s.running) == 0 {
		s.mu.Unlock()
		return false, nil
	}
	order := slices.Clone(s.running)
	slices.SortStableFunc(order, func(a, b *sequence) int { return a.req.Priority.rank() - b.req.Priority.rank() })
	budget := s.limits.MaxStepTokens
	var in []model.Input
	var batch, sampled []*sequence
	vocab := s.model.Config.VocabSize
	for _, seq := range order {
		if budget == 0 {
			break
		}
		remaining := len(seq.tokens) - seq.computed
		chunk := min(remaining, budget)
		budget -= chunk
		for p := seq.computed; p < seq.computed+chunk; p++ {
			inp := model.Input{Token: seq.tokens[p], Pos: p, Blocks: seq.blocks}
			if p == len(seq.tokens)-1 && !seq.req.PrefillOnly {
				if seq.logits == nil {
					seq.logits = make([]float32, vocab)
				}
				inp.Logits = seq.logits
				sampled = append(sampled, seq)
			}
			in = append(in, inp)
		}
		seq.computed += chunk
		seq.inFlight = true
		batch = append(batch, seq)
	}
	s.mu.Unlock()

	// Unlocked: nobody else touches the batch's sequences until inFlight
	// is cleared (Cancel waits for it).
	err := s.model.Forward(&s.ws, s.store, in)
	var ids []int
	if err == nil {
		for _, seq := range batch {
			s.publish(seq)
		}
		ids = s.sampleAll(sampled)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.stepDone.Broadcast()
	for _, seq := range batch {
		seq.inFlight = false
	}
	if err != nil {
		s.stepErrors++
		for _, seq := range batch {
			s.finishLocked(seq, Finish{Reason: FinishError, Err: err})
		}
		return true, fmt.Errorf("sched: step: %w", err)
	}
	for _, seq := range batch {
		if seq.cancelled {
			s.finishLocked(seq, Finish{Reason: FinishCancelled, Err: ErrCancelled})
		}
	}
	for _, seq := range batch {
		if seq.req.PrefillOnly && !seq.finished && seq.computed == len(seq.tokens) {
			s.finishLocked(seq, Finish{Reason: FinishPrefilled})
		}
	}
	for i, seq := range sampled {
		if seq.finished {
			continue
		}
		r := &seq.req
		pos := seq.nOutput + 1
		id := ids[i]
		seq.tokens = append(seq.tokens, id)
		seq.nOutput++
		s.generated++
		tok := Token{SequenceNo: pos, ID: id}
		if r.KeepLogits {
			tok.Logits = slices.Clone(seq.logits)
		}
		stop := slices.Contains(r.StopTokens, id)
		tok.Last = stop || seq.nOutput >= r.MaxTokens
		more := r.OnToken(tok)
		switch {
		case stop || !more:
			s.finishLocked(seq, Finish{Reason: FinishStop})
		case seq.nOutput >= r.MaxTokens:
			s.finishLocked(seq, Finish{Reason: FinishLength})
		}
	}
	return true, nil
}

// sampleAll picks the next token of every sequence. Sampling is a pure
// function of its inputs, so the sequences are split across goroutines.
func (s *Scheduler) sampleAll(seqs []*sequence) []int {
	ids := make([]int, len(seqs))
	workers := min(runtime.GOMAXPROCS(0), (len(seqs)+3)/4)
	for len(s.samplers) < workers {
		s.samplers = append(s.samplers, new(sample.Sampler))
	}
	sampleFrom := func(w int) {
		for i := w; i < len(seqs); i += workers {
			seq := seqs[i]
			r := &seq.req
			ids[i] = s.samplers[w].Sample(seq.logits, r.Sampling, seq.tokens[len(r.Prompt):], uint64(seq.nOutput+1))
		}
	}
	if workers == 1 {
		sampleFrom(0) // small batches: no goroutine per step
		return ids
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sampleFrom(w)
		}()
	}
	wg.Wait()
	return ids
}

// Run steps until ctx is done, sleeping while there is no work. On return
// every remaining sequence is cancelled.
func (s *Scheduler) Run(ctx context.Context) error {
	defer s.Close()
	for {
		// A failed step has already ended the sequences in its batch (and
		// counted it); the others keep running.
		busy, _ := s.Step()
		if busy {
			if ctx.Err() != nil {
				return ctx.Err()
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
