package sched

import (
	"fmt"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
)

// slotChecker is the reference model behind the Engine seam, checking on
// every step what an engine that keeps K/V per slot relies on: within
// the slot count, one sequence per slot in a step, and each slot's
// positions consecutive unless they start over (an input at a position
// at or below the slot's last discards the rest).
type slotChecker struct {
	modelEngine
	slots int
	next  map[int]int // the slot's next position
	owner map[int]*kvcache.BlockID
	fails []string
	// restarts counts a slot taken up again at position 0.
	restarts int
}

func (c *slotChecker) Forward(store kvcache.Store, in []model.Input) error {
	seen := map[int]*kvcache.BlockID{}
	for _, x := range in {
		switch {
		case x.Seq < 0 || x.Seq >= c.slots:
			c.fails = append(c.fails, fmt.Sprintf("slot %d of %d", x.Seq, c.slots))
		case seen[x.Seq] != nil && seen[x.Seq] != &x.Blocks[0]:
			c.fails = append(c.fails, fmt.Sprintf("slot %d holds two sequences in one step", x.Seq))
		case x.Pos > c.next[x.Seq]:
			c.fails = append(c.fails, fmt.Sprintf("slot %d: position %d after %d: a gap", x.Seq, x.Pos, c.next[x.Seq]))
		}
		if x.Pos == 0 && c.next[x.Seq] > 0 {
			c.restarts++
		}
		seen[x.Seq] = &x.Blocks[0]
		c.next[x.Seq] = x.Pos + 1
	}
	return c.modelEngine.Forward(store, in)
}

// TestSlotsAreExclusiveAndReused drives more sequences than slots through
// an engine keyed by slot: no two running sequences share one, a slot is
// taken again by a later sequence from position 0, and the tokens are
// those the reference model gives keyed by blocks.
func TestSlotsAreExclusiveAndReused(t *testing.T) {
	limits := Limits{MaxRunning: 3, MaxQueued: 16, MaxStepTokens: 24}
	reqs := func() []Request {
		var out []Request
		for i := range 9 {
			out = append(out, Request{ID: fmt.Sprint("r", i), Prompt: prompt(5+i*7%20, i), MaxTokens: 4 + i%5,
				Sampling: sample.Params{Temperature: 0.7, Seed: uint64(i)}})
		}
		return out
	}
	run := func(s *Scheduler) [][]Token {
		var recs []*recorder
		for _, r := range reqs() {
			rec := newRecorder()
			if err := s.Submit(rec.attach(r)); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, rec)
		}
		drain(t, s)
		var out [][]Token
		for _, r := range recs {
			out = append(out, r.tokens)
		}
		return out
	}
	want := run(func() *Scheduler { s, _ := newSched(t, 64, limits); return s }())

	store, err := kvcache.NewMemStore(tiny.KVLayout(kvcache.DefaultBlockSize), 64)
	if err != nil {
		t.Fatal(err)
	}
	c := &slotChecker{modelEngine: modelEngine{m: tiny}, slots: limits.Slots(), next: map[int]int{}}
	s, err := NewOn(c, store, limits)
	if err != nil {
		t.Fatal(err)
	}
	got := run(s)
	if len(c.fails) > 0 {
		t.Fatalf("slot contract broken: %v", c.fails)
	}
	if c.restarts < 6 {
		t.Fatalf("%d slots taken up again by a later sequence, want at least 6 (9 sequences, 3 slots)", c.restarts)
	}
	for i := range want {
		if fmt.Sprint(ids(want[i])) != fmt.Sprint(ids(got[i])) {
			t.Fatalf("request %d: %v through the seam, %v direct", i, ids(got[i]), ids(want[i]))
		}
	}
	if err := s.Speculate(Speculation{Draft: tiny, K: 2}); err == nil {
		t.Fatal("speculation accepted without the reference engine")
	}
}
