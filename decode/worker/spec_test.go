package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// TestSpeculativeWorkerFramesEqualPlain: workers speculating with a tiny
// draft and with a self-draft (the first two layers) send the frames a
// plain worker sends (token ids, text, numbering, finish), greedy and
// seeded, for fresh requests and for a continuation after a prefix; their
// health reports the draft tokens proposed and accepted.
func TestSpeculativeWorkerFramesEqualPlain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	gens := []*wire.Generate{
		{RequestId: "greedy", Prompt: "The lighthouse keeper", MaxTokens: 40, IgnoreEos: true},
		{RequestId: "seeded", Prompt: "Once upon a time", MaxTokens: 40, Temperature: 0.8, TopP: 0.95, Seed: 3, IgnoreEos: true},
		{RequestId: "stop", Prompt: "The river", MaxTokens: 60, Temperature: 0.7, Seed: 9, Stop: []string{"."}},
	}
	frames := func(w *testWorker, g *wire.Generate) []*wire.Frame {
		s, err := w.dial(t).Generate(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		return clustertest.CollectFrames(t, s)
	}
	plain := newTestWorkerWith(t, decode.Options{Preset: "small", WeightSeed: 1})
	want := map[string][]*wire.Frame{}
	for _, g := range gens {
		want[g.RequestId] = frames(plain, g)
	}
	for _, eopts := range []decode.Options{
		{Preset: "small", WeightSeed: 1, DraftPreset: "tiny", DraftK: 4},
		{Preset: "small", WeightSeed: 1, DraftLayers: 2, DraftK: 3},
	} {
		t.Run(fmt.Sprintf("draft=%q/layers=%d", eopts.DraftPreset, eopts.DraftLayers), func(t *testing.T) {
			if testing.Short() && eopts.DraftLayers != 0 {
				t.Skip("one draft under -short")
			}
			w := newTestWorkerWith(t, eopts)
			for _, g := range gens {
				sameFrames(t, frames(w, g), want[g.RequestId], 1, 0)
			}
			// A continuation after k tokens (what a migration sends)
			// gets the rest of the uninterrupted run.
			ref := want["seeded"]
			const k = 13
			cont := proto.Clone(gens[1]).(*wire.Generate)
			cont.RequestId = "cont"
			for _, f := range ref[:k] {
				cont.PrefixTokens = append(cont.PrefixTokens, f.TokenId)
			}
			sameFrames(t, frames(w, cont), ref, k+1, 0)

			h, err := w.dial(t).Health(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if h.DraftProposed == 0 || h.DraftAccepted > h.DraftProposed {
				t.Fatalf("health: %d draft tokens proposed, %d accepted", h.DraftProposed, h.DraftAccepted)
			}
			t.Logf("accepted %d of %d draft tokens", h.DraftAccepted, h.DraftProposed)
		})
	}
	if h, err := plain.dial(t).Health(ctx); err != nil || h.DraftProposed != 0 {
		t.Fatalf("a plain worker's health: %+v %v", h, err)
	}
}
