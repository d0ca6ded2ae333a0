package sched

import (
	"github.com/lifeline-llm/lifeline/decode/kvcache"
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

// Token is one generated output token.
type Token struct {
	// SequenceNo is the 1-based output position; with a prefix of k prior
	// output tokens the first new token is k+1.
	SequenceNo int
	ID         int
	// Logits of this position, when the request asked to keep them.
	Logits []float32
	// Logprob and TopLogprobs, when the request asked for logprobs: the
	// log-softmax of the position's raw logits (sample.Logprobs).
	Logprob     float64
	TopLogprobs []sample.TopLogprob
	// Last is set when this token ends the sequence by itself (a stop
	// token, the structured value closing, or the max_tokens budget).
	Last bool
	// Closed is set when this token closed the structured value: the
	// sequence ends with FinishStop.
	Closed bool
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
	// Grammar, when set, constrains the output (structured.go): the state
	// is replayed from Prefix at admission and advanced on every token.
	Grammar *Grammar
	// Logprobs asks for each token's log-probability, TopLogprobs
	// (0..sample.MaxTopLogprobs) for that many most likely alternatives.
	Logprobs    bool
	TopLogprobs int
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
	// slot is the sequence's engine slot while it runs, else -1;
	// restore marks it to be restored from the engine's saves
	// (Snapshotter), saved counts the SnapshotEvery periods saved.
	slot    int
	restore bool
	saved   int
	logits  []float32
	nOutput int
	// gram is a structured sequence's grammar state after its delivered
	// output; allowed is its mask's scratch (one sampler at a time).
	gram    gramState
	allowed []bool
}
