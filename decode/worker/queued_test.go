package worker

import (
	"context"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// TestQueuedRequestIsToldSo: with one slot, a second request waits in the
// queue; its stream gets queue_position frames (no token) while the first
// runs — one at once, more each second while it waits — and, once the
// first is cancelled, its tokens from 1.
func TestQueuedRequestIsToldSo(t *testing.T) {
	t.Parallel()
	w := newTestWorkerWith(t, decode.Options{Preset: "tiny", WeightSeed: 1, StepInterval: clustertest.PacedStep,
		Limits: sched.Limits{MaxRunning: 1, MaxQueued: 4, MaxStepTokens: 512}, KVBlocks: 128})
	c := w.dial(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	long, err := c.Generate(ctx, &wire.Generate{RequestId: "long", RequestEpoch: 1, Prompt: "a long one", MaxTokens: 1000, IgnoreEos: true, Temperature: 1, TopP: 1})
	if err != nil {
		t.Fatal(err)
	}
	if f, err := long.Next(); err != nil || f.SequenceNo != 1 {
		t.Fatalf("the first request's first frame: %v %v", f, err)
	}
	queued, err := c.Generate(ctx, &wire.Generate{RequestId: "queued", RequestEpoch: 1, Prompt: "x", MaxTokens: 3, IgnoreEos: true, Temperature: 1, TopP: 1})
	if err != nil {
		t.Fatal(err)
	}
	positions := 0
	for {
		f, err := queued.Next()
		if err != nil {
			t.Fatal(err)
		}
		if f.QueuePosition > 0 {
			if f.SequenceNo != 0 || f.QueuePosition != 1 {
				t.Fatalf("queue frame %v", f)
			}
			if positions++; positions == 2 {
				long.Cancel()
			}
			continue
		}
		if f.SequenceNo != 1 {
			t.Fatalf("after %d queue frames: %v", positions, f)
		}
		break
	}
	t.Logf("%d queue_position frames before the first token", positions)
}
