package e2e

import (
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// TestRelayBatchesFramesAfterAStall: the frontend is stopped (SIGSTOP)
// for 400 ms mid-stream while its paced worker goes on generating (about
// 80 tokens). Once it runs again, the frames received meanwhile reach
// the request's run loop in batches — fewer hand-offs than tokens — and
// the stream is the undisturbed run's, token for token: no gap, no
// duplicate, none reordered.
func TestRelayBatchesFramesAfterAStall(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(1))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	f := clustertest.StartFrontendProc(t, n)
	body := map[string]any{"model": "tiny", "prompt": "Once upon a time", "max_tokens": 400, "seed": 11, "temperature": 0.9, "stream": true, "ignore_eos": true}
	want, _, err := clustertest.Stream(f.URL, body, nil)
	if err != nil || len(want) != 400 {
		t.Fatalf("undisturbed run: %d tokens, %v", len(want), err)
	}
	tokens0 := tlsMetric(t, f.URL, nil, "lifeline_frontend_tokens_total")
	batches0 := tlsMetric(t, f.URL, nil, "lifeline_frontend_frame_batches_total")

	var seen atomic.Int64
	var stall sync.Once
	var stalled sync.WaitGroup
	got, _, err := clustertest.Stream(f.URL, body, func(clustertest.Token) {
		if seen.Add(1) == 20 {
			stall.Do(func() {
				stalled.Go(func() {
					if err := f.Signal(syscall.SIGSTOP); err != nil {
						t.Errorf("SIGSTOP: %v", err)
						return
					}
					time.Sleep(400 * time.Millisecond) // the stall under test
					f.Signal(syscall.SIGCONT)
				})
			})
		}
	})
	stalled.Wait()
	if err != nil || len(got) != len(want) {
		t.Fatalf("stalled run: %d tokens (undisturbed %d), %v", len(got), len(want), err)
	}
	for i := range want {
		if got[i].Seq != want[i].Seq || got[i].TokenID != want[i].TokenID || got[i].Text != want[i].Text {
			t.Fatalf("token %d: %+v, undisturbed %+v", i, got[i], want[i])
		}
	}
	tokens := tlsMetric(t, f.URL, nil, "lifeline_frontend_tokens_total") - tokens0
	batches := tlsMetric(t, f.URL, nil, "lifeline_frontend_frame_batches_total") - batches0
	t.Logf("%v tokens relayed in %v hand-offs", tokens, batches)
	// About 80 frames wait during the stall; read back 512 bytes at a
	// time, a dozen or so go to the run loop at once.
	if tokens != 400 || batches > tokens-20 {
		t.Fatalf("%v tokens in %v hand-offs: want 400 tokens in at most 380", tokens, batches)
	}
}
