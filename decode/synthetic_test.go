package decode

import (
	"context"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
)

// TestSyntheticEngine: the load-test engine holds its step rate whatever
// the batch, is served under its own name and numerics, and continues a
// sequence from any prefix bit-identically (a migrated stream on another
// synthetic worker is the stream that never moved).
func TestSyntheticEngine(t *testing.T) {
	t.Parallel() // paced by its own clock: it runs beside the others
	const rate = 200
	e, err := NewEngine(Options{Preset: "tiny", WeightSeed: 1, SyntheticRate: rate, Limits: sched.Limits{MaxRunning: 64, MaxQueued: 64, MaxStepTokens: 256}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.Model != nil || e.info.name != "synthetic-tiny" || e.info.numerics != syntheticNumerics {
		t.Fatalf("served as %q with numerics %q (model loaded: %v)", e.info.name, e.info.numerics, e.Model != nil)
	}
	base := Request{Prompt: "Once upon a time", MaxTokens: 100, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0.9, Seed: 7}}
	begin := time.Now()
	chans := make([]<-chan Event, 16)
	for i := range chans {
		if chans[i], err = e.Generate(context.Background(), base); err != nil {
			t.Fatal(err)
		}
	}
	runs := make([]result, len(chans))
	for i, ch := range chans {
		runs[i] = collect(t, ch)
	}
	took := time.Since(begin)
	// 16 sequences of 100 tokens in one batch: about 100 steps, at 200 a
	// second half a second; never faster than the rate.
	if low, high := 100*time.Second/rate, 4*100*time.Second/rate; took < low || took > high {
		t.Fatalf("16 × 100 tokens took %v at %d steps/s (want %v..%v)", took, rate, low, high)
	}
	ids := make([]int, 0, 100)
	for i, ev := range runs[0].events {
		ids = append(ids, ev.TokenID)
		for _, r := range runs[1:] {
			if r.events[i].TokenID != ev.TokenID {
				t.Fatalf("same request, different token %d", i+1)
			}
		}
	}
	for _, k := range []int{1, 37, 99} {
		r := base
		r.PrefixTokens = ids[:k]
		got := generate(t, e, r)
		for i, ev := range got.events {
			if want := runs[0].events[k+i]; ev.TokenID != want.TokenID || ev.Text != want.Text || ev.SequenceNo != want.SequenceNo {
				t.Fatalf("continued after %d: event %d = (%d, %q), want (%d, %q)", k, i, ev.TokenID, ev.Text, want.TokenID, want.Text)
			}
		}
	}
	if _, err := NewEngine(Options{Preset: "tiny", SyntheticRate: -1}); err == nil {
		t.Fatal("a negative synthetic rate was taken")
	}
	if _, err := NewEngine(Options{Preset: "tiny", SyntheticRate: 10, DraftPreset: "tiny"}); err == nil {
		t.Fatal("a synthetic engine with a draft was taken")
	}
}
