package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// rssAnon is a process's anonymous resident memory (/proc/pid/status).
func rssAnon(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssAnon:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no RssAnon in /proc/%d/status", pid)
	return 0
}

// hostile is request i of a round of hostile traffic: what reaches a
// worker through a frontend at its bounds, and clients that leave.
func hostile(i int) (g *wire.Generate, leave func(s *workerclient.Stream, frames int) bool) {
	g = &wire.Generate{RequestId: fmt.Sprintf("h%d", i), RequestEpoch: 1, Prompt: fmt.Sprintf("Hostile %d: once upon a time", i),
		MaxTokens: 48, Temperature: 0.9, TopP: 0.95, Seed: uint64(i), IgnoreEos: true}
	stay := func(*workerclient.Stream, int) bool { return false }
	switch i % 6 {
	case 0: // stop strings at the frontend's bound (256 KiB of them)
		for j := range 32 {
			g.Stop = append(g.Stop, fmt.Sprintf("%d-%s", j, strings.Repeat("x", 8<<10)))
		}
	case 1: // detachable, left after 5 frames: nobody attaches
		g.DetachGraceMs = 300
		return g, func(s *workerclient.Stream, n int) bool {
			if n == 5 {
				s.Detach()
				return true
			}
			return false
		}
	case 2: // cancelled after 3 frames
		return g, func(s *workerclient.Stream, n int) bool {
			if n == 3 {
				s.Cancel()
				return true
			}
			return false
		}
	case 3: // a prompt that fills the context
		g.Prompt = ""
		for j := range 440 {
			g.PromptTokens = append(g.PromptTokens, int32(3+(i*7+j)%200))
		}
		g.MaxTokens = 60
	case 4: // the most logprobs
		g.Logprobs, g.TopLogprobs = true, 20
	case 5: // a large logit bias and penalties
		g.LogitBias = map[int32]float64{}
		for j := range 300 {
			g.LogitBias[int32(j)] = float64(j%7) - 3
		}
		g.FrequencyPenalty, g.PresencePenalty = 1.5, 1.0
	}
	return g, stay
}

// TestWorkerMemoryUnderHostileTraffic: rounds of hostile traffic (stop
// strings at the bound, detached and cancelled requests, prompts that
// fill the context, logprobs, logit biases) must not grow a worker's live
// heap from one round to the next (a leak would), and its anonymous
// resident memory stays within its soft memory limit.
func TestWorkerMemoryUnderHostileTraffic(t *testing.T) {
	t.Parallel()
	ca := clustertest.CADir(t)
	// Paced tiny: requests last as long as small's (clients leave
	// mid-stream), at a fraction of its CPU.
	cmd, ready := startWorker(t, ca, "decode-m", 1, "--preset", "tiny", "--step-interval", "5ms")
	tlsConf, err := workerclient.ClientTLS(clustertest.Issue(t, ca, "frontend", "client"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := workerclient.Dial(ctx, ready.Addr, tlsConf, "decode-m", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const rounds, perRound, conc = 3, 72, 12
	var live, rss []uint64
	for r := range rounds {
		var wg sync.WaitGroup
		sem := make(chan struct{}, conc)
		for i := range perRound {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				g, leave := hostile(r*perRound + i)
				s, err := c.Generate(ctx, g)
				if err != nil {
					t.Error(err)
					return
				}
				for n := 1; ; n++ {
					if _, err := s.Next(); err != nil || leave(s, n) {
						return
					}
				}
			})
		}
		wg.Wait()
		var h *wire.HealthReply
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if h, err = c.Health(ctx); err == nil && h.InFlight == 0 && h.Detached == 0 && h.Running == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the worker still serves 30 s after its clients left: %+v %v", r, h, err)
			}
		}
		live, rss = append(live, h.LiveHeapBytes), append(rss, rssAnon(t, cmd.Process.Pid))
		t.Logf("round %d: live heap %.1f MiB (goal %.1f MiB, limit %.1f MiB), RssAnon %.1f MiB", r, mib(h.LiveHeapBytes), mib(h.HeapGoalBytes), mib(h.MemoryLimitBytes), mib(rss[r]))
		if h.MemoryLimitBytes == 0 || h.MemoryLimitBytes > h.LiveHeapBytes+h.LiveHeapBytes/4+128<<20 {
			t.Fatalf("round %d: the worker's soft memory limit is %.1f MiB over a live heap of %.1f MiB: want what it held at load plus 64 MiB (or a quarter of the heap)", r, mib(h.MemoryLimitBytes), mib(h.LiveHeapBytes))
		}
		// Resident memory is the runtime's (heap, stacks, its own
		// structures, all under the limit) and a few MiB besides.
		if rss[r] > h.MemoryLimitBytes+16<<20 {
			t.Errorf("round %d: RssAnon %.1f MiB over the soft limit %.1f MiB", r, mib(rss[r]), mib(h.MemoryLimitBytes))
		}
	}
	// A leak grows the live heap round after round; what the first round
	// warmed up (pools, the KV store's first use) stays.
	if grew := int64(live[rounds-1]) - int64(live[1]); grew > 4<<20 {
		t.Errorf("the live heap grew %.1f MiB from round 1 to round %d: %v", float64(grew)/(1<<20), rounds-1, live)
	}
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }
