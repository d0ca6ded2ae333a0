package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// longPrompt is a distinct prompt of about n tokens (built-in tokenizer).
func longPrompt(tag string, n int) string {
	tok := tokenizer.NewBuiltin()
	var b strings.Builder
	b.WriteString(tag + ". ")
	for {
		ids, _ := tok.Encode(b.String())
		if len(ids) >= n {
			return b.String()
		}
		b.WriteString("the river ran past the old mill and the children watched the boats go by, ")
	}
}

// runRTOBench kills the decode worker of a stream with about 2,000 tokens
// of prompt after sequence 8, and measures kill → next token at the
// client, with the new worker pulling the prefix KV from the dead worker's
// node (KV reuse) and with a frontend that names no peers (recompute).
func runRTOBench(kills int) error {
	const promptTokens, killAfter = 2000, 8
	fmt.Printf("## Request RTO after a decode kill at %d tokens of context (small preset, 2 nodes × 1 worker)\n\n", promptTokens)
	c, err := startBenchCluster(1024)
	if err != nil {
		return err
	}
	defer c.close()
	reuseURL, err := c.frontend()
	if err != nil {
		return err
	}
	recomputeURL, err := c.frontend("--no-kv-pull")
	if err != nil {
		return err
	}
	gens := map[string]uint64{}
	for id, r := range c.regs {
		gens[id] = r.Generation
	}
	phases := map[string][]time.Duration{} // of the reuse runs: kill → each step of the migration
	measure := func(url, mode string) (rto []time.Duration, reused []float64, err error) {
		for k := 0; k < kills; k++ {
			body, _ := json.Marshal(map[string]any{"model": "small", "prompt": longPrompt(fmt.Sprintf("%s run %d", mode, k), promptTokens),
				"max_tokens": 24, "seed": k, "stream": true, "ignore_eos": true})
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(body)))
			if err != nil {
				return nil, nil, err
			}
			var killed time.Time
			victim := ""
			for rd := sse.NewReader(resp.Body); ; {
				ev, err := rd.Next()
				if err != nil {
					break
				}
				if ev.Chunk == nil {
					continue
				}
				l := ev.Chunk.Lifeline
				switch l.SequenceNo {
				case killAfter:
					victim = l.InstanceID
					killed = c.kill(victim)
				case killAfter + 1:
					rto = append(rto, time.Since(killed))
				case 0:
					if l.Migrations > 0 {
						reused = append(reused, float64(l.KVReusedPositions))
						if mode == "reuse" {
							for step, ns := range l.LastMigration {
								phases[step] = append(phases[step], time.Unix(0, ns).Sub(killed))
							}
						}
					}
				}
			}
			resp.Body.Close()
			if victim == "" {
				return nil, nil, fmt.Errorf("%s run %d: no worker killed", mode, k)
			}
			wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			r, err := c.env.WaitRegistration(wctx, victim, gens[victim])
			cancel()
			if err != nil {
				return nil, nil, err
			}
			gens[victim] = r.Generation
		}
		return rto, reused, nil
	}
	reuseRTO, reuseKV, err := measure(reuseURL, "reuse")
	if err != nil {
		return err
	}
	recomputeRTO, recomputeKV, err := measure(recomputeURL, "recompute")
	if err != nil {
		return err
	}
	fmt.Printf("| kill after sequence %d, %d kills each | RTO p50 | RTO p99 | positions reused by the new worker (median) |\n|---|---|---|---|\n", killAfter, kills)
	fmt.Printf("| KV reuse (pulled from the dead worker's node: peers dialled ahead of need, bytes over the data path) | %v | %v | %.0f |\n", pct(reuseRTO, 50), pct(reuseRTO, 99), median(reuseKV))
	fmt.Printf("| recompute (`--no-kv-pull`) | %v | %v | %.0f |\n", pct(recomputeRTO, 50), pct(recomputeRTO, 99), median(recomputeKV))
	fmt.Printf("| recompute / reuse | **%.1f×** | %.1f× | |\n\n", float64(pct(recomputeRTO, 50))/float64(pct(reuseRTO, 50)), float64(pct(recomputeRTO, 99))/float64(pct(reuseRTO, 99)))
	printRTOPhases(phases)
	return nil
}

// printRTOPhases is where a reuse run's recovery time goes: from the kill
// to each step of the migration as the frontend timed it (its end chunk's
// last_migration), and the steps' own durations.
func printRTOPhases(phases map[string][]time.Duration) {
	steps := []struct{ key, what string }{
		{"failure_seen_unix_ns", "the frontend sees the failure (stream reset, death notice)"},
		{"routed_unix_ns", "routed to another instance"},
		{"dispatched_unix_ns", "the new worker took the request"},
		{"first_token_unix_ns", "its first token at the frontend (its prefix pulled, the rest computed, a token decoded)"},
	}
	fmt.Printf("| KV reuse: kill → step | p50 | p99 | step alone p50 | step alone p99 |\n|---|---|---|---|---|\n")
	var prev []time.Duration
	for _, s := range steps {
		at := phases[s.key]
		var alone []time.Duration
		for i := range at {
			if i < len(prev) {
				alone = append(alone, at[i]-prev[i])
			} else {
				alone = append(alone, at[i])
			}
		}
		fmt.Printf("| %s | %v | %v | %v | %v |\n", s.what, pct(at, 50), pct(at, 99), pct(alone, 50), pct(alone, 99))
		prev = at
	}
	fmt.Println()
}
