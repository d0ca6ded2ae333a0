package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// runFrontendBench measures, in one run: tokens/s and inter-token latency
// through the frontend vs straight from the worker, and the request RTO
// after a decode worker is killed mid-stream.
func runFrontendBench(kills int) error {
	fmt.Printf("## Frontend (small preset, 2 nodes × 1 worker; real processes)\n\n")
	cluster, err := startBenchCluster(256)
	if err != nil {
		return err
	}
	defer cluster.close()
	certs, regs := cluster.env.Certs, cluster.regs
	url, err := cluster.frontend()
	if err != nil {
		return err
	}

	// Direct vs through the frontend: the same seeded 256-token stream.
	const tokens = 256
	workTLS, _ := workerclient.ClientTLS(certs)
	r0 := regs["b0-decode-small-0"]
	direct := func() ([]time.Duration, time.Duration, error) {
		ctx := context.Background()
		c, err := workerclient.Dial(ctx, r0.Addr, workTLS, r0.InstanceID, r0.Generation)
		if err != nil {
			return nil, 0, err
		}
		defer c.Close()
		start := time.Now()
		s, err := c.Generate(ctx, &wire.Generate{RequestId: "direct", Prompt: "The river ran", MaxTokens: tokens, Seed: 1, Temperature: 0.8, IgnoreEos: true})
		if err != nil {
			return nil, 0, err
		}
		var gaps []time.Duration
		last := start
		for {
			f, err := s.Next()
			if err != nil || f.FinishReason != "" {
				break
			}
			gaps = append(gaps, time.Since(last))
			last = time.Now()
		}
		return gaps, time.Since(start), nil
	}
	through := func() ([]time.Duration, time.Duration, error) {
		start := time.Now()
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(
			fmt.Sprintf(`{"model":"small","prompt":"The river ran","max_tokens":%d,"seed":1,"temperature":0.8,"stream":true,"ignore_eos":true}`, tokens)))
		if err != nil {
			return nil, 0, err
		}
		defer resp.Body.Close()
		var gaps []time.Duration
		last := start
		for rd := sse.NewReader(resp.Body); ; {
			ev, err := rd.Next()
			if err != nil {
				break
			}
			if ev.ID != "" {
				gaps = append(gaps, time.Since(last))
				last = time.Now()
			}
		}
		return gaps, time.Since(start), nil
	}
	var dT, fT []float64
	var dGaps, fGaps []time.Duration
	for i := 0; i < 3; i++ {
		g, el, err := direct()
		if err != nil {
			return err
		}
		dGaps = append(dGaps, g...)
		dT = append(dT, float64(len(g))/el.Seconds())
		g, el, err = through()
		if err != nil {
			return err
		}
		fGaps = append(fGaps, g...)
		fT = append(fT, float64(len(g))/el.Seconds())
	}
	med := func(v []float64) float64 { s := append([]float64(nil), v...); sortFloats(s); return s[len(s)/2] }
	fmt.Printf("| measure | direct from the worker | through the frontend | ratio |\n|---|---|---|---|\n")
	fmt.Printf("| tokens/s (256-token stream, median of 3) | %.0f | %.0f | %.2f |\n", med(dT), med(fT), med(fT)/med(dT))
	fmt.Printf("| inter-token latency p50 | %v | %v | |\n", pct(dGaps, 50), pct(fGaps, 50))
	fmt.Printf("| inter-token latency p99 | %v | %v | |\n\n", pct(dGaps, 99), pct(fGaps, 99))
	if err := limitsCost(cluster); err != nil {
		return err
	}

	// RTO: kill the serving worker right after sequence 64 arrives.
	var rto, detect, announce, routing, prefill []time.Duration
	gens := map[string]uint64{"b0-decode-small-0": regs["b0-decode-small-0"].Generation, "b1-decode-small-0": regs["b1-decode-small-0"].Generation}
	for k := 0; k < kills; k++ {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(
			fmt.Sprintf(`{"model":"small","prompt":"Kill %d","max_tokens":160,"seed":%d,"stream":true,"ignore_eos":true}`, k, k)))
		if err != nil {
			return err
		}
		var killed time.Time
		victim := ""
		var timeline map[string]int64
		for rd := sse.NewReader(resp.Body); ; {
			ev, err := rd.Next()
			if err != nil {
				break
			}
			if ev.Chunk == nil {
				continue
			}
			l := ev.Chunk.Lifeline
			if l.LastMigration != nil {
				timeline = l.LastMigration
			}
			switch l.SequenceNo {
			case 64:
				victim = l.InstanceID
				killed = cluster.kill(victim)
			case 65:
				rto = append(rto, time.Since(killed))
			}
		}
		resp.Body.Close()
		evs, _ := cluster.nodeOf(victim).Events(context.Background())
		for i := len(evs) - 1; i >= 0; i-- {
			if evs[i].Kind == controlapi.EventExit && evs[i].InstanceID == victim {
				detect = append(detect, evs[i].DetectedAt.Sub(killed))
				if timeline != nil {
					at := func(k string) time.Time { return time.Unix(0, timeline[k]) }
					announce = append(announce, at("failure_seen_unix_ns").Sub(evs[i].DetectedAt))
					routing = append(routing, at("dispatched_unix_ns").Sub(at("failure_seen_unix_ns")))
					prefill = append(prefill, at("first_token_unix_ns").Sub(at("dispatched_unix_ns")))
				}
				break
			}
		}
		if victim != "" {
			wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			r, err := cluster.env.WaitRegistration(wctx, victim, gens[victim])
			cancel()
			if err != nil {
				return err
			}
			gens[victim] = r.Generation
		}
	}
	fmt.Printf("| request RTO after a decode kill (small, kill after sequence 64, %d kills) | p50 | p99 |\n|---|---|---|\n", kills)
	fmt.Printf("| kill → next token at the client | %v | %v |\n", pct(rto, 50), pct(rto, 99))
	fmt.Printf("| 1. kill → detection (eBPF) | %v | %v |\n", pct(detect, 50), pct(detect, 99))
	fmt.Printf("| 2. detection → failure seen at the frontend (deregistration + etcd watch) | %v | %v |\n", pct(announce, 50), pct(announce, 99))
	fmt.Printf("| 3. routing and opening the stream to the new worker | %v | %v |\n", pct(routing, 50), pct(routing, 99))
	fmt.Printf("| 4. re-prefill of prompt + 64 tokens and the first new token | %v | %v |\n\n", pct(prefill, 50), pct(prefill, 99))
	return nil
}

func sortFloats(v []float64) {
	for i := 1; i < len(v); i++ {
		for j := i; j > 0 && v[j] < v[j-1]; j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
}
