package reqfsm

import (
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/openai"
)

// TestRetryBudgetBoundsRetries: retries spend the bucket's tokens, a
// completed request refills Ratio of one, and an empty bucket refuses a
// re-route after an overload with the typed error. A migration after a
// worker's failure is charged but never refused (a worker's death must
// not end its streams), and it drains the bucket for re-routes.
func TestRetryBudgetBoundsRetries(t *testing.T) {
	b := NewRetryBudget(2, 0.5)
	p := DefaultPolicy
	p.Retries = b
	overloadedTwice := func(id string) *Request {
		r := NewRequest(id, []int{1}, 10, time.Time{}, p, t0)
		start(t, r, "a")
		rte, _ := has[Route](r.OnOverloaded(r.Epoch))
		r.Routed(rte.Epoch, Endpoint{"b", 1}, t0)
		return r
	}
	for i := range 2 {
		if r := overloadedTwice("r"); r.State != Prefilling {
			t.Fatalf("retry %d within the budget: state %s", i, r.State)
		}
	}
	r := overloadedTwice("r3")
	if r.State != Failed || r.Err.Type != openai.ErrRetryBudget {
		t.Fatalf("past the budget: %s %v", r.State, r.Err)
	}
	// Two completions refill one token.
	for range 2 {
		done := NewRequest("ok", []int{1}, 1, time.Time{}, p, t0)
		start(t, done, "a")
		done.OnFrame(Frame{From: done.Endpoint, Epoch: done.Epoch, SequenceNo: 1, FinishReason: "length"}, t0)
	}
	// Migrations with the bucket refilled, then empty: never refused.
	m := NewRequest("m", []int{1}, 10, time.Time{}, p, t0)
	start(t, m, "a")
	m.OnFrame(frame(m, 1), t0)
	if m.OnWorkerFailed(m.Epoch, "killed", true, t0); m.State != Migrating {
		t.Fatalf("a migration: %s %v", m.State, m.Err)
	}
	m.Routed(m.Epoch, Endpoint{"b", 1}, t0)
	if m.OnWorkerFailed(m.Epoch, "killed again", true, t0); m.State != Migrating {
		t.Fatalf("a migration with the bucket empty was refused: %s %v", m.State, m.Err)
	}
	// The migrations drained what the completions refilled: a re-route
	// after an overload is refused.
	if r := overloadedTwice("r4"); r.State != Failed || r.Err.Type != openai.ErrRetryBudget {
		t.Fatalf("a re-route after migrations drained the bucket: %s %v", r.State, r.Err)
	}
	if b.spent.Load() != 4 || b.refused.Load() != 2 {
		t.Fatalf("spent %d refused %d", b.spent.Load(), b.refused.Load())
	}
	var nilBudget *RetryBudget
	if !nilBudget.Spend() {
		t.Fatal("no budget refused a retry")
	}
}
