package sched

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
)

var tiny = func() *model.Model {
	m, err := model.Synthetic("tiny", 3)
	if err != nil {
		panic(err)
	}
	return m
}()

func newSched(t *testing.T, blocks int, limits Limits) (*Scheduler, *kvcache.MemStore) {
	t.Helper()
	store, err := kvcache.NewMemStore(tiny.KVLayout(kvcache.DefaultBlockSize), blocks)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(tiny, store, limits)
	if err != nil {
		t.Fatal(err)
	}
	return s, store
}

// recorder collects what the scheduler reports for one request.
type recorder struct {
	mu     sync.Mutex
	tokens []Token
	finish *Finish
	done   chan struct{}
}

func newRecorder() *recorder { return &recorder{done: make(chan struct{})} }

func (r *recorder) attach(req Request) Request {
	req.OnToken = func(t Token) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.tokens = append(r.tokens, t)
		return true
	}
	req.OnFinish = func(f Finish) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.finish != nil {
			panic("finished twice")
		}
		r.finish = &f
		close(r.done)
	}
	return req
}

func prompt(n, salt int) []int {
	p := []int{1}
	for i := 1; i < n; i++ {
		p = append(p, 300+(i*53+salt*17)%2500)
	}
	return p
}

func drain(t *testing.T, s *Scheduler) {
	t.Helper()
	for i := 0; ; i++ {
		busy, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		if !busy {
			return
		}
		if i > 100000 {
			t.Fatal("scheduler never went idle")
		}
	}
}

func TestHardLimitsRejectTyped(t *testing.T) {
	req := func(id string, plen, max int) Request {
		return newRecorder().attach(Request{ID: id, Prompt: prompt(plen, 1), MaxTokens: max})
	}
	check := func(err error, want Limit) {
		t.Helper()
		var oe *OverloadedError
		if !errors.As(err, &oe) || !errors.Is(err, ErrOverloaded) || !oe.Retryable() {
			t.Fatalf("got %v, want a retryable *OverloadedError", err)
		}
		if oe.Limit != want {
			t.Fatalf("limit %q, want %q (%v)", oe.Limit, want, err)
		}
	}

	// Running limit, no queue.
	s, _ := newSched(t, 64, Limits{MaxRunning: 2, MaxQueued: 0, MaxStepTokens: 64})
	for i := 0; i < 2; i++ {
		if err := s.Submit(req(fmt.Sprint(i), 4, 4)); err != nil {
			t.Fatal(err)
		}
	}
	check(s.Submit(req("x", 4, 4)), LimitRunning)

	// Queue limit: two more fit in the queue, the next is rejected.
	s, _ = newSched(t, 64, Limits{MaxRunning: 1, MaxQueued: 2, MaxStepTokens: 64})
	for i := 0; i < 3; i++ {
		if err := s.Submit(req(fmt.Sprint(i), 4, 4)); err != nil {
			t.Fatal(err)
		}
	}
	check(s.Submit(req("x", 4, 4)), LimitQueued)
	if st := s.Stats(); st.Running != 1 || st.Queued != 2 {
		t.Fatalf("stats %+v", st)
	}

	// KV limit: 4 blocks, the first request reserves 3.
	s, store := newSched(t, 4, Limits{MaxRunning: 8, MaxQueued: 0, MaxStepTokens: 64})
	if err := s.Submit(req("a", 20, 21)); err != nil { // 40 positions = 3 blocks
		t.Fatal(err)
	}
	free := store.NumFree()
	check(s.Submit(req("b", 20, 21)), LimitKVBlocks)
	if store.NumFree() != free {
		t.Fatalf("a rejected request changed free blocks %d -> %d", free, store.NumFree())
	}
	// More than the whole store: not retryable.
	if err := s.Submit(req("c", 40, 40)); !errors.Is(err, ErrTooLarge) || errors.Is(err, ErrOverloaded) {
		t.Fatalf("oversized request: %v", err)
	}
}

func TestCancelFreesBlocks(t *testing.T) {
	s, store := newSched(t, 32, Limits{MaxRunning: 4, MaxQueued: 4, MaxStepTokens: 64})
	total := store.NumFree()
	var recs []*recorder
	for i := 0; i < 6; i++ {
		r := newRecorder()
		recs = append(recs, r)
		if err := s.Submit(r.attach(Request{ID: fmt.Sprint(i), Prompt: prompt(10, i), MaxTokens: 30, Sampling: sample.Params{Temperature: 0.8, Seed: 1}})); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 5; i++ {
		if _, err := s.Step(); err != nil {
			t.Fatal(err)
		}
	}
	used := total - store.NumFree()
	if used != 4*3 { // 4 running × ceil(39/16)
		t.Fatalf("%d blocks in use, want 12", used)
	}
	// Cancel a running one: its 3 blocks come back before Cancel returns.
	if err := s.Cancel("1"); err != nil {
		t.Fatal(err)
	}
	if got := total - store.NumFree(); got != used-3 {
		t.Fatalf("after cancel %d blocks in use, want %d", got, used-3)
	}
	if f := recs[1].finish; f == nil || f.Reason != FinishCancelled || !errors.Is(f.Err, ErrCancelled) {
		t.Fatalf("cancelled sequence finished with %+v", f)
	}
	// Cancel a queued one: nothing to free, but it never runs.
	if err := s.Cancel("5"); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel("5"); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("second cancel: %v", err)
	}
	drain(t, s)
	if len(recs[5].tokens) != 0 {
		t.Fatalf("cancelled queued request produced %d tokens", len(recs[5].tokens))
	}
	if store.NumFree() != total {
		t.Fatalf("%d blocks leaked", total-store.NumFree())
	}
	for i, r := range recs {
		if i == 1 || i == 5 {
			continue
		}
		if r.finish == nil || r.finish.Reason != FinishLength || len(r.tokens) != 30 {
			t.Fatalf("request %d: %d tokens, finish %+v", i, len(r.tokens), r.finish)
		}
	}
}

func TestInteractiveBeforeBatch(t *testing.T) {
	s, _ := newSched(t, 64, Limits{MaxRunning: 1, MaxQueued: 8, MaxStepTokens: 64})
	var order []string
	var mu sync.Mutex
	submit := func(id string, p Priority) {
		r := newRecorder()
		req := r.attach(Request{ID: id, Prompt: prompt(4, 2), MaxTokens: 2, Priority: p})
		inner := req.OnToken
		req.OnToken = func(tok Token) bool {
			if tok.SequenceNo == 1 {
				mu.Lock()
				order = append(order, id)
				mu.Unlock()
			}
			return inner(tok)
		}
		if err := s.Submit(req); err != nil {
			t.Fatal(err)
		}
	}
	submit("first", Batch) // starts at once
	submit("b1", Batch)
	submit("b2", Batch)
	submit("i1", Interactive)
	submit("i2", Interactive)
	drain(t, s)
	want := "[first i1 i2 b1 b2]"
	if fmt.Sprint(order) != want {
		t.Fatalf("start order %v, want %s", order, want)
	}
}

// TestBatchInvariantTokens runs a request alone and then inside a batch of 32
// mixed requests (different prompt lengths, budgets, priorities, sampling),
// with chunked prefill, and asserts identical tokens and logits.
func TestBatchInvariantTokens(t *testing.T) {
	target := Request{ID: "target", Prompt: prompt(37, 9), MaxTokens: 60, KeepLogits: true,
		Sampling: sample.Params{Temperature: 0.9, TopP: 0.95, Seed: 1234}}

	s, _ := newSched(t, 64, DefaultLimits)
	alone := newRecorder()
	if err := s.Submit(alone.attach(target)); err != nil {
		t.Fatal(err)
	}
	drain(t, s)

	s, store := newSched(t, 512, Limits{MaxRunning: 64, MaxQueued: 64, MaxStepTokens: 40})
	batched := newRecorder()
	for i := 0; i < 31; i++ {
		r := newRecorder()
		req := Request{ID: fmt.Sprint("other", i), Prompt: prompt(3+i*5%60, i), MaxTokens: 5 + i*7%50, Priority: Priority(i % 2),
			Sampling: sample.Params{Temperature: float64(i%3) * 0.5, TopK: i % 5, Seed: uint64(i)}}
		if err := s.Submit(r.attach(req)); err != nil {
			t.Fatal(err)
		}
		if i == 15 {
			if err := s.Submit(batched.attach(target)); err != nil {
				t.Fatal(err)
			}
		}
	}
	drain(t, s)
	if store.NumFree() != store.Capacity() {
		t.Fatalf("%d blocks leaked", store.Capacity()-store.NumFree())
	}
	if len(alone.tokens) != 60 || len(batched.tokens) != 60 {
		t.Fatalf("alone %d tokens, batched %d", len(alone.tokens), len(batched.tokens))
	}
	for i := range alone.tokens {
		a, b := alone.tokens[i], batched.tokens[i]
		if len(a.Logits) != tiny.Config.VocabSize || len(b.Logits) != len(a.Logits) {
			t.Fatalf("token %d: logits of %d and %d values", i, len(a.Logits), len(b.Logits))
		}
		if a.ID != b.ID || a.SequenceNo != b.SequenceNo {
			t.Fatalf("token %d: alone %+v, batched %+v", i, a.ID, b.ID)
		}
		for j := range a.Logits {
			if math.Float32bits(a.Logits[j]) != math.Float32bits(b.Logits[j]) {
				t.Fatalf("token %d logit %d: alone %v, batched %v", i, j, a.Logits[j], b.Logits[j])
			}
		}
	}
}

func TestBadRequests(t *testing.T) {
	s, store := newSched(t, 16, DefaultLimits)
	base := newRecorder().attach(Request{ID: "r", Prompt: prompt(5, 1), MaxTokens: 5})
	for name, mut := range map[string]func(*Request){
		"empty id":       func(r *Request) { r.ID = "" },
		"empty prompt":   func(r *Request) { r.Prompt = nil },
		"max tokens 0":   func(r *Request) { r.MaxTokens = 0 },
		"max tokens -1":  func(r *Request) { r.MaxTokens = -1 },
		"context":        func(r *Request) { r.MaxTokens = tiny.Config.ContextLen },
		"max int":        func(r *Request) { r.MaxTokens = math.MaxInt },
		"token id":       func(r *Request) { r.Prompt = []int{1, tiny.Config.VocabSize} },
		"negative id":    func(r *Request) { r.Prompt = []int{-4} },
		"prefix too big": func(r *Request) { r.Prefix = []int{5, 5, 5, 5, 5} },
		"stop in prefix": func(r *Request) { r.Prefix = []int{2}; r.StopTokens = []int{2} },
		"sampling":       func(r *Request) { r.Sampling.TopP = 7 },
		"priority":       func(r *Request) { r.Priority = 9 },
		"no callbacks":   func(r *Request) { r.OnToken = nil },
		"prefill prefix": func(r *Request) { r.PrefillOnly = true; r.Prefix = []int{5} },
	} {
		r := base
		mut(&r)
		if err := s.Submit(r); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: %v, want ErrInvalidRequest", name, err)
		}
	}
	if err := s.Submit(base); err != nil {
		t.Fatal(err)
	}
	if err := s.Submit(base); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("duplicate id: %v", err)
	}
	drain(t, s)
	if store.NumFree() != store.Capacity() {
		t.Fatal("blocks leaked")
	}
}

func TestRunAndClose(t *testing.T) {
	s, store := newSched(t, 64, DefaultLimits)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	r := newRecorder()
	if err := s.Submit(r.attach(Request{ID: "a", Prompt: prompt(5, 1), MaxTokens: 8})); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not finish the request")
	}
	long := newRecorder()
	if err := s.Submit(long.attach(Request{ID: "b", Prompt: prompt(5, 1), MaxTokens: 400})); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	<-long.done
	if long.finish.Reason != FinishCancelled || len(long.tokens) >= 400 {
		t.Fatalf("open request ended with %+v after %d tokens", long.finish, len(long.tokens))
	}
	if store.NumFree() != store.Capacity() {
		t.Fatal("blocks leaked after Run returned")
	}
	if err := s.Submit(newRecorder().attach(Request{ID: "c", Prompt: prompt(5, 1), MaxTokens: 8})); !errors.Is(err, ErrClosed) {
		t.Fatalf("submit after close: %v", err)
	}
}

// TestCanaryNeverQueuesBehindTraffic: with every regular slot taken and no
// queue, a canary still starts (on its held-back block), runs first, and a
// second concurrent canary is rejected at once.
func TestCanaryNeverQueuesBehindTraffic(t *testing.T) {
	s, store := newSched(t, 8, Limits{MaxRunning: 1, MaxQueued: 0, MaxStepTokens: 64})
	busy := newRecorder()
	if err := s.Submit(busy.attach(Request{ID: "busy", Prompt: prompt(40, 1), MaxTokens: 60})); err != nil {
		t.Fatal(err)
	}
	if err := s.Submit(newRecorder().attach(Request{ID: "more", Prompt: prompt(4, 1), MaxTokens: 4})); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("regular request with the slot taken: %v", err)
	}
	canary := newRecorder()
	if err := s.Submit(canary.attach(Request{ID: "canary", Prompt: prompt(4, 2), MaxTokens: 6, Priority: Canary})); err != nil {
		t.Fatalf("canary behind traffic: %v", err)
	}
	var oe *OverloadedError
	if err := s.Submit(newRecorder().attach(Request{ID: "canary2", Prompt: prompt(4, 2), MaxTokens: 6, Priority: Canary})); !errors.As(err, &oe) || oe.Limit != LimitCanary {
		t.Fatalf("second canary: %v", err)
	}
	if err := s.Submit(newRecorder().attach(Request{ID: "big", Prompt: prompt(10, 2), MaxTokens: 10, Priority: Canary})); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("oversized canary: %v", err)
	}
	for i := 0; i < 6; i++ {
		if _, err := s.Step(); err != nil {
			t.Fatal(err)
		}
	}
	if canary.finish == nil || len(canary.tokens) != 6 {
		t.Fatalf("canary not done after 6 steps: %d tokens", len(canary.tokens))
	}
	drain(t, s)
	if store.NumFree() != store.Capacity() {
		t.Fatal("blocks leaked")
	}
}

// TestStatsCountComputedPositions: a prefill-only request samples no
// token, yet every step shows up as computed positions, and the step time
// is reported.
func TestStatsCountComputedPositions(t *testing.T) {
	s, _ := newSched(t, 16, Limits{MaxRunning: 2, MaxQueued: 0, MaxStepTokens: 32})
	r := newRecorder()
	if err := s.Submit(r.attach(Request{ID: "prefill", Prompt: prompt(100, 3), MaxTokens: 1, PrefillOnly: true})); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := 0; i < 4; i++ {
		if _, err := s.Step(); err != nil {
			t.Fatal(err)
		}
		st := s.Stats()
		if st.Computed <= last || st.Generated != 0 || st.StepTime <= 0 {
			t.Fatalf("step %d: computed %d (was %d), generated %d, step time %v", i, st.Computed, last, st.Generated, st.StepTime)
		}
		last = st.Computed
	}
	<-r.done
	if st := s.Stats(); st.Computed != 100 || r.finish.Reason != FinishPrefilled {
		t.Fatalf("after the prefill: computed %d, finish %+v", st.Computed, r.finish)
	}
}

// TestStepIntervalPacesRun: with a step interval, Run starts a step no
// sooner than the interval after the previous one (8 tokens of tiny take
// about a millisecond unpaced), its step time says so, and a cancel ends
// a Run waiting to step.
func TestStepIntervalPacesRun(t *testing.T) {
	s, store := newSched(t, 64, DefaultLimits)
	const interval, tokens = 25 * time.Millisecond, 8
	s.SetStepInterval(interval)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	r := newRecorder()
	start := time.Now()
	if err := s.Submit(r.attach(Request{ID: "a", Prompt: prompt(5, 1), MaxTokens: tokens})); err != nil {
		t.Fatal(err)
	}
	<-r.done
	// One step a token: the last starts at least tokens-1 intervals after
	// the first.
	if took := time.Since(start); took < (tokens-1)*interval || len(r.tokens) != tokens {
		t.Fatalf("%d tokens in %v, want %d in at least %v", len(r.tokens), took, tokens, (tokens-1)*interval)
	}
	// The step time a drain or a canary allows for is the paced one.
	if st := s.Stats(); st.StepTime < interval || st.MeanStepTime < interval {
		t.Fatalf("step time %v, mean %v: below the %v interval", st.StepTime, st.MeanStepTime, interval)
	}
	s.SetStepInterval(time.Hour)
	long := newRecorder()
	if err := s.Submit(long.attach(Request{ID: "b", Prompt: prompt(5, 1), MaxTokens: 400})); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancel did not end a Run waiting an hour to step")
	}
	<-long.done
	if store.NumFree() != store.Capacity() {
		t.Fatal("blocks leaked after Run returned")
	}
}
