package reqfsm

import (
	"sync"
	"sync/atomic"
)

// RetryBudget is a frontend's token bucket for retries, in the style of
// gRPC's and Envoy's retry budgets: a re-route after an overload refusal
// spends one token (Spend), a migration after a worker's failure is
// charged one without ever being refused (Charge); every request that
// completes adds Ratio of a token, up to Max. While the bucket is empty
// re-routes are refused, so that under overload worker attempts stay
// within about 1 + Ratio per request (plus Max once). Make it with
// NewRetryBudget; it is safe for concurrent use; a nil *RetryBudget
// allows every retry.
type RetryBudget struct {
	Max   float64
	Ratio float64

	mu     sync.Mutex
	tokens float64

	// Counters: requests' first worker attempts and their further ones
	// (the amplification figure), retries spent and refused.
	attempts, again, spent, refused atomic.Uint64
}

// DefaultRetryBudget is Max and Ratio unless configured otherwise.
var DefaultRetryBudget = struct{ Max, Ratio float64 }{Max: 20, Ratio: 0.1}

// NewRetryBudget returns a full bucket.
func NewRetryBudget(maxTokens, ratio float64) *RetryBudget {
	return &RetryBudget{Max: maxTokens, Ratio: ratio, tokens: maxTokens}
}

// Spend takes a token for one retry, or reports that none is left.
func (b *RetryBudget) Spend() bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < 1 {
		b.refused.Add(1)
		return false
	}
	b.tokens--
	b.spent.Add(1)
	return true
}

// Charge takes a token for a migration after a worker's failure without
// ever refusing it: a worker's death must not end the streams it served
// (each request's own migration budget bounds them), but the migrations
// drain the bucket, so that re-routes under overload are refused while
// the cluster is failing.
func (b *RetryBudget) Charge() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = max(0, b.tokens-1)
	b.spent.Add(1)
}

// Succeeded refills the bucket by Ratio for a completed request.
func (b *RetryBudget) Succeeded() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.Max, b.tokens+b.Ratio)
}

// Attempted counts a decode worker attempt of a request: its first, or
// a further one (a re-route, a migration).
func (b *RetryBudget) Attempted(first bool) {
	switch {
	case b == nil:
	case first:
		b.attempts.Add(1)
	default:
		b.again.Add(1)
	}
}

// Tokens is the bucket's level now.
func (b *RetryBudget) Tokens() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens
}

// RetryCounters are a budget's counters: requests' first worker attempts
// and their further ones, retries spent and refused.
type RetryCounters struct{ Attempts, Again, Spent, Refused uint64 }

// Counters reads the counters.
func (b *RetryBudget) Counters() RetryCounters {
	return RetryCounters{Attempts: b.attempts.Load(), Again: b.again.Load(), Spent: b.spent.Load(), Refused: b.refused.Load()}
}

// Amplification is worker attempts ÷ requests so far (1 with none).
func (b *RetryBudget) Amplification() float64 {
	a := b.attempts.Load()
	if a == 0 {
		return 1
	}
	return float64(a+b.again.Load()) / float64(a)
}
