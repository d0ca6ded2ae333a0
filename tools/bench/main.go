// Command bench measures the reference engine and prints a Markdown table
// of figures and ratios against baselines measured in the same run: decode
// throughput at batch 1 and 16, prefill throughput, the matrix kernel's
// GFLOP/s and the machine's memcpy bandwidth.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/matmul"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
)

func main() {
	tokens := flag.Int("tokens", 64, "output tokens per sequence in the decode runs")
	minRatio := flag.Float64("min-batch-ratio", 6, "required batch-16/batch-1 decode throughput on small")
	minStream := flag.Float64("min-stream", 0.9, "required batch-1 decode weight bandwidth, as a fraction of a read-only stream over as many bytes")
	kills := flag.Int("kills", 50, "SIGKILLs per detector in the failure detection bench")
	only := flag.String("only", "", "run only this part: engine, kv, detect, frontend, limits, transfer, rto, pd, drain, upgrade, failover, responses, structured, spec, tp, startup, streams, fleet, llamacpp or goengine (the last two built with -tags llamacpp)")
	drains := flag.Int("drains", 20, "drains of one node in the drain bench")
	fleetStreams := flag.Int("fleet-streams", 1000, "streams in the fleet bench (4 frontends, 8 synthetic workers)")
	fleetAdmit := flag.Int("fleet-admit-rate", 1000, "requests admitted a second through one frontend in the fleet bench")
	fleetAdmitFor := flag.Duration("fleet-admit-for", 3*time.Second, "how long the fleet bench admits requests at -fleet-admit-rate")
	fleetRecords := flag.Bool("fleet-records", true, "the fleet bench's relay through frontends that write request records")
	flag.Parse()
	var err error
	switch *only {
	case "detect":
		err = runDetectionBench(*kills)
	case "kv":
		err = runKVBench()
	case "frontend":
		err = runFrontendBench(*kills / 5)
	case "limits":
		err = runLimitsBench()
	case "transfer":
		err = runTransferBench()
	case "rto":
		err = runRTOBench(*kills / 5)
	case "pd":
		err = runPDBench(5)
	case "drain":
		err = runDrainBench(*drains)
	case "upgrade":
		err = runUpgradeBench()
	case "failover":
		err = runFailoverBench(*kills * 2 / 5)
	case "structured":
		err = runStructuredBench()
	case "spec":
		err = runSpecBench(*tokens)
	case "tp":
		err = runTPBench(20)
	case "startup":
		err = runStartupBench()
	case "streams":
		err = runStreamsBench()
	case "fleet":
		err = runFleetBench(*fleetStreams, *fleetAdmit, *fleetAdmitFor, *fleetRecords)
	case "responses":
		err = runResponsesBench(*kills / 5)
	case "llamacpp":
		err = runLlamaCppBench()
	case "goengine":
		err = runGoEngineBench()
	case "engine", "":
		err = run(*tokens, *minRatio, *minStream)
		if err == nil && *only == "" {
			err = runStartupBench()
		}
		if err == nil && *only == "" {
			err = runDetectionBench(*kills)
		}
		if err == nil && *only == "" {
			err = runFrontendBench(*kills / 5)
		}
		if err == nil && *only == "" {
			err = runTransferBench()
		}
		if err == nil && *only == "" {
			err = runRTOBench(*kills / 5)
		}
		if err == nil && *only == "" {
			err = runPDBench(5)
		}
		if err == nil && *only == "" {
			err = runDrainBench(*drains)
		}
		if err == nil && *only == "" {
			err = runUpgradeBench()
		}
		if err == nil && *only == "" {
			err = runFailoverBench(*kills * 2 / 5)
		}
		if err == nil && *only == "" {
			err = runResponsesBench(*kills / 5)
		}
		if err == nil && *only == "" {
			err = runStructuredBench()
		}
		if err == nil && *only == "" {
			err = runSpecBench(*tokens)
		}
		if err == nil && *only == "" {
			err = runTPBench(20)
		}
		if err == nil && *only == "" {
			err = runStreamsBench()
		}
		if err == nil && *only == "" {
			err = runFleetBench(*fleetStreams, *fleetAdmit, *fleetAdmitFor, *fleetRecords)
		}
	default:
		err = fmt.Errorf("-only %q: want engine, kv, detect, frontend, limits, transfer, rto, pd, drain, upgrade, failover, responses, structured, spec, tp, startup, streams, fleet, llamacpp or goengine", *only)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// median3 runs a measurement three times and keeps the median: the machines
// are shared and a single run is noise.
func median3(f func() (float64, error)) (float64, error) {
	var v [3]float64
	for i := range v {
		x, err := f()
		if err != nil {
			return 0, err
		}
		v[i] = x
	}
	slices.Sort(v[:])
	return v[1], nil
}

// prefillLen fits both presets' contexts with room for one output token.
const prefillLen = 448

func newScheduler(m *model.Model, sequences, positions int) (*sched.Scheduler, kvcache.Store, error) {
	bs := kvcache.DefaultBlockSize
	// Plus the blocks the scheduler holds back for a canary.
	store, err := kvcache.NewMemStore(m.KVLayout(bs), sequences*((positions+bs-1)/bs)+(sched.CanaryMaxPositions+bs-1)/bs)
	if err != nil {
		return nil, nil, err
	}
	s, err := sched.New(m, store, sched.Limits{MaxRunning: sequences, MaxQueued: sequences, MaxStepTokens: 512})
	return s, store, err
}

// generated counts the tokens the benchmark's sequences produced, so that a
// run that silently generated nothing cannot report a throughput.
var generated int

func submit(s *sched.Scheduler, id string, prompt []int, maxTokens int) error {
	return s.Submit(sched.Request{ID: id, Prompt: prompt, MaxTokens: maxTokens,
		Sampling: sample.Params{Temperature: 0.8, Seed: 1},
		OnToken:  func(sched.Token) bool { generated++; return true }, OnFinish: func(sched.Finish) {}})
}

func promptOf(n int) []int {
	p := []int{1}
	for i := 1; i < n; i++ {
		p = append(p, 300+i*7%2000)
	}
	return p
}

// decodeThroughput runs batch sequences with an 8-token prompt until each
// has produced tokens outputs; the prefill steps are excluded from the time.
func decodeThroughput(m *model.Model, batch, tokens int) (float64, error) {
	const promptLen = 8
	s, _, err := newScheduler(m, batch, promptLen+tokens)
	if err != nil {
		return 0, err
	}
	for i := 0; i < batch; i++ {
		if err := submit(s, fmt.Sprint(i), promptOf(promptLen), tokens+1); err != nil {
			return 0, err
		}
	}
	generated = 0
	// The first step prefills every prompt and samples each first token.
	if _, err := s.Step(); err != nil {
		return 0, err
	}
	start := time.Now()
	for {
		busy, err := s.Step()
		if err != nil {
			return 0, err
		}
		if !busy {
			break
		}
	}
	elapsed := time.Since(start)
	if generated != batch*(tokens+1) {
		return 0, fmt.Errorf("decode bench: %d tokens generated, want %d", generated, batch*(tokens+1))
	}
	return float64(batch*tokens) / elapsed.Seconds(), nil
}

func prefillThroughput(m *model.Model, n int) (float64, error) {
	s, _, err := newScheduler(m, 1, n+1)
	if err != nil {
		return 0, err
	}
	generated = 0
	if err := submit(s, "p", promptOf(n), 1); err != nil {
		return 0, err
	}
	start := time.Now()
	for {
		busy, err := s.Step()
		if err != nil {
			return 0, err
		}
		if !busy {
			break
		}
	}
	if generated != 1 {
		return 0, fmt.Errorf("prefill bench: the prompt was never computed")
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

func kernelGFLOPs(T int) float64 {
	const m, n = 1024, 384
	w := make([]float32, m*n)
	x := make([]float32, T*n)
	for i := range w {
		w[i] = float32(i%97) / 97
	}
	for i := range x {
		x[i] = float32(i%13) / 13
	}
	out := make([]float32, T*m)
	iters := 0
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		matmul.MatMul(out, x, T, w, m, n)
		iters++
	}
	return float64(2*T*m*n*iters) / time.Since(start).Seconds() / 1e9
}

func memcpyGBs() float64 {
	src := make([]byte, 64<<20)
	dst := make([]byte, len(src))
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src)
	iters := 0
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		copy(dst, src)
		iters++
	}
	return float64(len(src)*iters) / time.Since(start).Seconds() / 1e9
}
