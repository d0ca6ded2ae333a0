package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// runPDBench serves requests with about 1,000 tokens of prompt through a
// prefill/decode split, on one node (the decode worker reads the prefill
// worker's blocks in place) and across two nodes (the decode node pulls
// them over QUIC), and reports the hand-off's timeline and bytes moved.
func runPDBench(requests int) error {
	const promptTokens = 1000
	fmt.Printf("## Prefill → decode hand-off (small preset, %d-token prompts, %d requests each, medians)\n\n", promptTokens, requests)
	fmt.Printf("| placement | prefill | transfer | decode: dispatch → first token | payload bytes copied between arenas | positions the decode worker reused |\n|---|---|---|---|---|---|\n")
	for _, place := range []struct {
		name    string
		prefill int
	}{{"same node (P and D on b0)", 0}, {"two nodes (P on b1, D on b0)", 1}} {
		c, err := startBenchCluster(1024, place.prefill)
		if err != nil {
			return err
		}
		url, err := c.frontend()
		if err != nil {
			c.close()
			return err
		}
		var prefill, transfer, first []time.Duration
		var reused []float64
		for k := 0; k < requests; k++ {
			body, _ := json.Marshal(map[string]any{"model": "small", "prompt": longPrompt(fmt.Sprintf("hand-off %d", k), promptTokens), "max_tokens": 4, "seed": k})
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(body)))
			if err != nil {
				c.close()
				return err
			}
			var out struct {
				Lifeline struct {
					PD       string             `json:"pd"`
					Reused   float64            `json:"kv_reused_positions"`
					Timeline map[string]float64 `json:"pd_timeline_ms"`
				}
			}
			json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if out.Lifeline.PD == "" || out.Lifeline.PD == "recompute" || out.Lifeline.PD == "transfer_failed" {
				c.close()
				return fmt.Errorf("%s: request %d not handed off: %q", place.name, k, out.Lifeline.PD)
			}
			ms := func(k string) time.Duration {
				return time.Duration(out.Lifeline.Timeline[k] * float64(time.Millisecond))
			}
			prefill, transfer, first = append(prefill, ms("prefill")), append(transfer, ms("transfer")), append(first, ms("decode_first_token"))
			reused = append(reused, out.Lifeline.Reused)
		}
		var copied uint64
		for _, n := range c.nodes {
			if st, err := n.Status(context.Background()); err == nil {
				copied += st.KVTransfer.Stats.BytesPulled
			}
		}
		sortFloats(reused)
		fmt.Printf("| %s | %v | %v | %v | %d | %.0f |\n", place.name, pct(prefill, 50), pct(transfer, 50), pct(first, 50), copied, reused[len(reused)/2])
		c.close()
	}
	fmt.Println()
	return nil
}
