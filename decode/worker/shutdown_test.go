package worker

import (
	"context"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// TestWorkerStopDeliversFinish: a worker stopped (its SIGTERM) while a
// request is in flight finishes it and delivers every frame, the finish
// frame included, before it closes its connections.
func TestWorkerStopDeliversFinish(t *testing.T) {
	t.Parallel()
	for i := range 3 {
		c, stop := startStoppableWorker(t)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		s, err := c.Generate(ctx, &wire.Generate{RequestId: "r", Prompt: "Once", MaxTokens: 6, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Next(); err != nil {
			t.Fatal(err)
		}
		stopped := make(chan error, 1)
		go func() { stopped <- stop() }()
		fs := clustertest.CollectFrames(t, s)
		if len(fs) != 6 || fs[len(fs)-1].FinishReason != "length" {
			t.Fatalf("run %d: after the first token, %d frames, last %+v", i, len(fs), fs[len(fs)-1])
		}
		// Read to the end, the client hangs up, as a frontend does: the
		// worker stops then rather than after its closeGrace.
		c.Close()
		if err := <-stopped; err != nil {
			t.Fatalf("run %d: worker stopped with %v", i, err)
		}
		cancel()
	}
}
