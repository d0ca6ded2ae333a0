package decode

import (
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
)

// TestStepIntervalPacesWithTheSameBits: a paced reference engine gives the
// tokens of an unpaced one (pacing waits between steps, it computes
// nothing), a step interval apart; a bad interval is refused by name.
func TestStepIntervalPacesWithTheSameBits(t *testing.T) {
	t.Parallel()
	const interval, tokens = 20 * time.Millisecond, 10
	paced, err := NewEngine(Options{Preset: "tiny", WeightSeed: 1, StepInterval: interval, Limits: sched.DefaultLimits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(paced.Close)
	r := Request{Prompt: "The paced engine", MaxTokens: tokens, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0.9, Seed: 7}}
	start := time.Now()
	got := generate(t, paced, r)
	took := time.Since(start)
	want := generate(t, newTinyEngine(t), r)
	if len(got.events) != tokens || len(want.events) != tokens {
		t.Fatalf("%d and %d tokens, want %d each", len(got.events), len(want.events), tokens)
	}
	for i := range got.events {
		if got.events[i].TokenID != want.events[i].TokenID {
			t.Fatalf("token %d: %d paced, %d unpaced", i, got.events[i].TokenID, want.events[i].TokenID)
		}
	}
	if took < (tokens-1)*interval {
		t.Fatalf("%d tokens in %v at a step every %v", tokens, took, interval)
	}
	for _, o := range []Options{
		{Preset: "tiny", StepInterval: -time.Millisecond},
		{Preset: "tiny", StepInterval: 2 * time.Second},
		{Preset: "tiny", StepInterval: time.Millisecond, SyntheticRate: 10},
	} {
		if _, err := NewEngine(o); err == nil || !strings.Contains(err.Error(), "step_interval") {
			t.Errorf("%+v: %v, want an error naming step_interval", o, err)
		}
	}
}
