package decode

import (
	"errors"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
)

func TestDraftOptionsRefusedByName(t *testing.T) {
	for name, c := range map[string]struct {
		opts  Options
		field string
	}{
		"preset and layers": {Options{Preset: "tiny", DraftPreset: "tiny", DraftLayers: 1}, "draft"},
		"negative layers":   {Options{Preset: "tiny", DraftLayers: -1}, "draft_layers"},
		"all layers":        {Options{Preset: "tiny", DraftLayers: 2}, "draft"},
		"unknown preset":    {Options{Preset: "tiny", DraftPreset: "huge"}, "draft"},
		"k too large":       {Options{Preset: "tiny", DraftLayers: 1, DraftK: sched.MaxDraftK + 1}, "draft_k"},
		"negative k":        {Options{Preset: "tiny", DraftLayers: 1, DraftK: -1}, "draft_k"},
	} {
		e, err := NewEngine(c.opts)
		var re *RequestError
		if !errors.As(err, &re) || re.Field != c.field {
			t.Errorf("%s: %v, want a RequestError on %q", name, err, c.field)
		}
		if e != nil {
			e.Close()
		}
	}
}

// TestSpeculativeEngineTextEqualsPlain: text chunks, stop strings and
// finish reasons of a speculating engine are the plain engine's, also for
// a continuation.
func TestSpeculativeEngineTextEqualsPlain(t *testing.T) {
	plain := newTinyEngine(t)
	spec, err := NewEngine(Options{Preset: "tiny", WeightSeed: 1, DraftLayers: 1, DraftK: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(spec.Close)
	for _, r := range []Request{
		{Prompt: "Once upon a time", MaxTokens: 40},
		{Prompt: "The water was cold and the", MaxTokens: 40, Sampling: sample.Params{Temperature: 0.9, Seed: 4}, Stop: []string{"the"}},
		{Prompt: "a", MaxTokens: 30, Sampling: sample.Params{Temperature: 0.7, Seed: 8}, PrefixTokens: []int{400, 401, 402}},
	} {
		want, got := generate(t, plain, r), generate(t, spec, r)
		if len(got.events) != len(want.events) || got.finish.FinishReason != want.finish.FinishReason {
			t.Fatalf("%q: %d events (%s), want %d (%s)", r.Prompt, len(got.events), got.finish.FinishReason, len(want.events), want.finish.FinishReason)
		}
		for i, w := range want.events {
			g := got.events[i]
			if g.SequenceNo != w.SequenceNo || g.TokenID != w.TokenID || g.Text != w.Text || g.FinishReason != w.FinishReason {
				t.Fatalf("%q: event %d: %+v, want %+v", r.Prompt, i, g, w)
			}
		}
	}
	if st := spec.Stats(); st.DraftProposed == 0 {
		t.Fatalf("nothing speculated: %+v", st)
	}
}
