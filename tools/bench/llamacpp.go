//go:build llamacpp

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/shm"
)

// The llama.cpp bench's sizes: every engine holds llamaSlots sequences of
// llamaContext positions (what a worker with the default limits holds).
const (
	llamaContext = 2304
	llamaTokens  = 64   // output tokens per sequence in the decode runs
	llamaPrefill = 1024 // prompt tokens in the prefill run
	llamaRounds  = 3
	llamaPairs   = 5    // pairs the throughput ratios are the median of
	llamaLong    = 2048 // the context of the migration figures
)

var llamaLimits = decode.DefaultLlamaCppLimits

// llamaFigures are one weight type's throughputs, tokens/s, and the
// medians of Lifeline ÷ plain over back-to-back pairs.
type llamaFigures struct {
	plain, life [3]float64 // batch 1, batch 16, prefill
	ratio       [3]float64
}

// runLlamaCppBench measures the llama.cpp engine on generated GGUFs of
// the small preset's shape: Lifeline's engine (scheduler, sampler,
// detokenizer over the binding) against a plain loop over the same
// binding, then what a migration costs at 2k positions.
func runLlamaCppBench() error {
	fmt.Printf("\n# llama.cpp engine benchmark\n\n")
	dir, err := os.MkdirTemp("", "lifeline-bench-gguf")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	types := []gguf.TensorType{gguf.Q8_0, gguf.F16}
	names := []string{"Q8_0", "F16"}
	paths := make([]string, len(types))
	figs := make([]llamaFigures, len(types))
	for i, t := range types {
		shape := llamacpptest.Small
		shape.Weights = t
		sub := filepath.Join(dir, names[i])
		if err := os.Mkdir(sub, 0o755); err != nil {
			return err
		}
		if paths[i], err = llamacpptest.Write(sub, shape, 1); err != nil {
			return err
		}
		if i == 0 {
			fmt.Printf("%s\n\n", llamacpp.SystemInfo())
		}
		if figs[i], err = measureLlama(paths[i]); err != nil {
			return fmt.Errorf("%s: %w", names[i], err)
		}
	}
	fmt.Printf("\n| tokens/s (Lifeline ÷ plain loop, median of %d pairs) |", llamaPairs)
	for _, n := range names {
		fmt.Printf(" %s |", n)
	}
	fmt.Printf("\n|---|---|---|\n")
	for k, row := range []string{"decode, batch 1", "decode, batch 16", fmt.Sprintf("prefill, %d tokens", llamaPrefill)} {
		fmt.Printf("| %s |", row)
		for _, f := range figs {
			fmt.Printf(" %.0f ÷ %.0f = **%.3f** |", f.life[k], f.plain[k], f.ratio[k])
		}
		fmt.Println()
	}
	if err := runLlamaMigrationBench(paths[0]); err != nil {
		return err
	}
	return goEngineOn(names, paths)
}

// measureLlama measures one GGUF: a plain context and a Lifeline engine
// of the same sizes, open side by side, measured in alternation.
func measureLlama(path string) (llamaFigures, error) {
	var f llamaFigures
	m, err := llamacpp.LoadModel(path, llamacpp.ModelParams{})
	if err != nil {
		return f, err
	}
	defer m.Close()
	c, err := m.NewContext(llamacpp.ContextParams{Context: llamaContext, Sequences: llamaLimits.Slots(), Batch: llamaLimits.MaxStepTokens, Threads: 2})
	if err != nil {
		return f, err
	}
	defer c.Close()
	e, err := decode.NewEngine(decode.Options{Engine: decode.EngineLlamaCpp, ModelPath: path, Threads: 2, ContextLen: llamaContext, Limits: llamaLimits})
	if err != nil {
		return f, err
	}
	defer e.Close()
	fmt.Printf("- %s: numerics `%s`, continuation %s\n", filepath.Base(filepath.Dir(path)), e.NumericsID(), e.Continuation())
	plain, life, err := paired(func(batch, prompt, out int) (float64, error) { return plainLoop(c, m, batch, prompt, out) },
		func(batch, prompt, out int) (float64, error) { return lifelineRun(e, batch, prompt, out) })
	if err != nil {
		return f, err
	}
	for k := range benchRuns {
		ratios := make([]float64, len(plain[k]))
		for i := range ratios {
			ratios[i] = life[k][i] / plain[k][i]
		}
		f.plain[k], f.life[k], f.ratio[k] = median(plain[k]), median(life[k]), median(ratios)
	}
	return f, nil
}

// benchRuns are what the llama.cpp benches measure: batch 1, batch 16
// (sequences, prompt tokens, output tokens each) and a prefill.
var benchRuns = [3]struct{ batch, prompt, out int }{{1, 16, llamaTokens}, {16, 16, llamaTokens}, {1, llamaPrefill, 1}}

// paired measures a and b on every benchRun, llamaPairs times back to
// back, each going first in every other pair (what runs second meets a
// warmer, or hotter, machine): throughputs per run and pair, output
// tokens per second (prompt tokens for the prefill).
func paired(a, b func(batch, prompt, out int) (float64, error)) (as, bs [3][]float64, err error) {
	for round := range llamaPairs {
		for k, r := range benchRuns {
			var x, y float64
			for i := range 2 {
				if (i+round)%2 == 0 {
					x, err = a(r.batch, r.prompt, r.out)
				} else {
					y, err = b(r.batch, r.prompt, r.out)
				}
				if err != nil {
					return as, bs, err
				}
			}
			if k == 2 {
				x, y = x*llamaPrefill, y*llamaPrefill
			}
			as[k], bs[k] = append(as[k], x), append(bs[k], y)
		}
	}
	return as, bs, nil
}

// benchPrompt is sequence i's prompt of n token ids (none special).
func benchPrompt(i, n, vocab int) []int {
	out := make([]int, n)
	for j := range out {
		out[j] = 3 + (i*131+j*17)%(vocab-3)
	}
	return out
}

// plainLoop decodes batch sequences of a prompt tokens (after BOS when
// the model adds one) and out greedy tokens each on c — one Decode per
// step for every sequence, prompts in chunks of the step size — and
// returns output tokens per second.
func plainLoop(c *llamacpp.Context, m *llamacpp.Model, batch, prompt, out int) (float64, error) {
	next := make([]int32, batch)
	var logits []float32
	start := time.Now()
	var in []llamacpp.Input
	for i := range batch {
		p := benchPrompt(i, prompt, m.VocabSize())
		if m.Tokenizer().AddBOS() {
			p = append([]int{int(m.BOS())}, p...)
		}
		for j, t := range p {
			in = append(in, llamacpp.Input{Seq: int32(i), Pos: int32(j), Token: int32(t), Logits: j == len(p)-1})
		}
	}
	pos := len(in) / batch
	for made := 0; ; made++ {
		for len(in) > 0 {
			chunk := in[:min(len(in), llamaLimits.MaxStepTokens)]
			if err := c.Decode(chunk); err != nil {
				return 0, err
			}
			k := 0
			for _, x := range chunk {
				if !x.Logits {
					continue
				}
				var err error
				if logits, err = c.Logits(k, logits); err != nil {
					return 0, err
				}
				next[x.Seq], k = int32(llamacpp.Argmax(logits)), k+1
			}
			in = in[len(chunk):]
		}
		if made == out-1 {
			break
		}
		for i := range batch {
			in = append(in, llamacpp.Input{Seq: int32(i), Pos: int32(pos), Token: next[i], Logits: true})
		}
		pos++
	}
	d := time.Since(start)
	for i := range batch {
		c.Forget(int32(i), 0)
	}
	return float64(batch*out) / d.Seconds(), nil
}

// lifelineRun is plainLoop's work as requests to Lifeline's engine: batch
// greedy requests at once, every event read.
func lifelineRun(e *decode.Engine, batch, prompt, out int) (float64, error) {
	start := time.Now()
	chans := make([]<-chan decode.Event, batch)
	for i := range chans {
		var err error
		chans[i], err = e.Generate(context.Background(), decode.Request{PromptTokens: benchPrompt(i, prompt, e.Tokenizer.VocabSize()),
			MaxTokens: out, IgnoreEOS: true, Sampling: sample.Params{Temperature: 0}})
		if err != nil {
			return 0, err
		}
	}
	n := 0
	for _, ch := range chans {
		for ev := range ch {
			if ev.Err != nil {
				return 0, ev.Err
			}
			if !ev.Done {
				n++
			}
		}
	}
	if n != batch*out {
		return 0, fmt.Errorf("%d tokens out of %d", n, batch*out)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// runLlamaMigrationBench measures, at 2k positions of the GGUF at path:
// a sequence's state exported and imported per arena block against
// recomputing as many positions; what a killed worker's successor waits
// for its next token with the state imported from the node's arena
// against recomputed; and what publishing every SnapshotEvery tokens
// costs the decode.
func runLlamaMigrationBench(path string) error {
	if err := llamaStateBench(path); err != nil {
		return err
	}
	node, err := startKVNode(4096, arenaSlotBytes)
	if err != nil {
		return err
	}
	defer node.stop()
	if err := warmArena(node); err != nil {
		return err
	}
	open := func(instance string) (*decode.Engine, error) {
		o := decode.Options{Engine: decode.EngineLlamaCpp, ModelPath: path, Threads: 2, ContextLen: llamaContext, Limits: llamaLimits}
		if instance != "" {
			o.KVSocket, o.InstanceID, o.Generation = node.socket, instance, 1
		}
		return decode.NewEngine(o)
	}
	var engines [3]*decode.Engine // publishing, successor (arena), alone (no arena)
	for i, id := range []string{"first", "successor", ""} {
		if engines[i], err = open(id); err != nil {
			return err
		}
		defer engines[i].Close()
	}
	first, successor, alone := engines[0], engines[1], engines[2]
	const out, cut = 128, 64
	var costs, imported, recomputed []float64
	var computing time.Duration // the publishing engine's requests, end to end
	reused := 0
	for round := range llamaRounds {
		req := decode.Request{PromptTokens: benchPrompt(round, llamaLong, first.Tokenizer.VocabSize()), MaxTokens: out, IgnoreEOS: true}
		published, err := timedRun(first, req)
		if err != nil {
			return err
		}
		unpublished, err := timedRun(alone, req)
		if err != nil {
			return err
		}
		costs = append(costs, published.decode.Seconds()/unpublished.decode.Seconds()-1)
		computing += published.first + published.decode
		cont := req
		cont.PrefixTokens = published.tokens[:cut]
		for _, r := range []struct {
			e   *decode.Engine
			dst *[]float64
		}{{successor, &imported}, {alone, &recomputed}} {
			got, err := timedRun(r.e, cont)
			if err != nil {
				return err
			}
			if got.tokens[0] != published.tokens[cut] {
				return fmt.Errorf("the continuation's first token %d, the uninterrupted run's %d", got.tokens[0], published.tokens[cut])
			}
			*r.dst = append(*r.dst, got.first.Seconds()*1e3)
			if r.e == successor {
				reused = got.reused
			}
			if r.e == successor && got.reused < llamaLong {
				return fmt.Errorf("the successor imported %d positions, want at least %d", got.reused, llamaLong)
			}
		}
	}
	st := first.SnapshotStats()
	fmt.Printf("\n| migration at %d positions (median of %d) | figure |\n|---|---|\n", llamaLong+cut, llamaRounds)
	fmt.Printf("| next token after a kill, state imported from the arena (%d positions) | %.1f ms |\n", reused, median(imported))
	fmt.Printf("| next token after a kill, %d positions recomputed | %.1f ms |\n", llamaLong+cut, median(recomputed))
	fmt.Printf("| import ÷ recompute | **%.3f** |\n", median(imported)/median(recomputed))
	rs := successor.SnapshotStats()
	fmt.Printf("| of which the restore (read, verify, import) | %.1f ms |\n", rs.RestoreTime.Seconds()*1e3/float64(max(rs.Restored, 1)))
	fmt.Printf("| saves (every %d positions: prefill chunks, prefill end, decode): their time ÷ the rest of the requests' | **%.1f %%** (%d saves, %.1f MiB and %.1f ms each; %d skipped by the budget) |\n",
		sched.SnapshotEvery, 100*st.SaveTime.Seconds()/(computing-st.SaveTime).Seconds(), st.Saved,
		float64(st.SavedBytes)/float64(max(st.Saved, 1))/(1<<20), st.SaveTime.Seconds()*1e3/float64(max(st.Saved, 1)), st.Skipped)
	fmt.Printf("| decode with saves ÷ without, %d tokens (two engines; noise of a few %%) | %.3f |\n", out, 1+median(costs))
	return nil
}

// arenaSlotBytes is an agent's default arena block.
const arenaSlotBytes = 131072

// timedRun is one greedy request's tokens, the time to its first token,
// the time from its first token to its end and the positions it reused.
type timedResult struct {
	tokens        []int
	first, decode time.Duration
	reused        int
}

func timedRun(e *decode.Engine, r decode.Request) (timedResult, error) {
	var res timedResult
	start := time.Now()
	ch, err := e.Generate(context.Background(), r)
	if err != nil {
		return res, err
	}
	var firstAt time.Time
	for ev := range ch {
		switch {
		case ev.Err != nil:
			return res, ev.Err
		case ev.Done:
			res.reused = ev.ReusedPositions
		default:
			if firstAt.IsZero() {
				firstAt = time.Now()
				res.first = firstAt.Sub(start)
			}
			res.tokens = append(res.tokens, ev.TokenID)
		}
	}
	if len(res.tokens) == 0 {
		return res, fmt.Errorf("no tokens")
	}
	res.decode = time.Since(firstAt)
	return res, nil
}

// llamaStateBench prints a 2k-position sequence's state exported and
// imported per arena block against recomputing the positions a block
// holds.
func llamaStateBench(path string) error {
	m, err := llamacpp.LoadModel(path, llamacpp.ModelParams{})
	if err != nil {
		return err
	}
	defer m.Close()
	c, err := m.NewContext(llamacpp.ContextParams{Context: llamaContext, Sequences: 2, Batch: llamaLimits.MaxStepTokens, Threads: 2})
	if err != nil {
		return err
	}
	defer c.Close()
	var exports, imports, recomputes []float64
	var blocks int
	var buf []byte // kept, as a worker keeps it
	for range llamaRounds {
		tps, err := plainLoop(c, m, 1, llamaLong-1, 1)
		if err != nil {
			return err
		}
		recomputes = append(recomputes, 1/tps) // one output token: seconds per run
		state, took, err := exportAfterPrefill(c, m, &buf)
		if err != nil {
			return err
		}
		blocks = (len(state) + arenaSlotBytes - 1) / arenaSlotBytes
		exports = append(exports, took.Seconds())
		start := time.Now()
		if err := c.Import(1, state); err != nil {
			return err
		}
		imports = append(imports, time.Since(start).Seconds())
		c.Forget(0, 0)
		c.Forget(1, 0)
	}
	perBlock := func(v []float64) float64 { return median(v) / float64(blocks) * 1e6 }
	fmt.Printf("\n| %d positions' state, per %d KiB arena block (%d blocks) | µs |\n|---|---|\n", llamaLong, arenaSlotBytes>>10, blocks)
	fmt.Printf("| export (llama_state_seq_get_data, into a kept buffer) | %.0f |\n| import (llama_state_seq_set_data) | %.0f |\n", perBlock(exports), perBlock(imports))
	fmt.Printf("| recompute the positions a block holds | %.0f |\n", perBlock(recomputes))
	return nil
}

// exportAfterPrefill computes a 2k prompt into sequence 0 and times its
// export.
func exportAfterPrefill(c *llamacpp.Context, m *llamacpp.Model, buf *[]byte) ([]byte, time.Duration, error) {
	p := benchPrompt(0, llamaLong, m.VocabSize())
	for i := 0; i < len(p); i += llamaLimits.MaxStepTokens {
		var in []llamacpp.Input
		for j := i; j < min(len(p), i+llamaLimits.MaxStepTokens); j++ {
			in = append(in, llamacpp.Input{Seq: 0, Pos: int32(j), Token: int32(p[j])})
		}
		if err := c.Decode(in); err != nil {
			return nil, 0, err
		}
	}
	start := time.Now()
	state, err := c.ExportInto(0, buf)
	return state, time.Since(start), err
}

// warmArena writes every block of node's arena once, as a node's arena
// is after its first pass: a first write to a page of shared memory
// costs more than the copy (as in runKVBench).
func warmArena(node *kvNode) error {
	client, err := kvclient.Dial(context.Background(), node.socket, kv.Writer{Instance: "bench-warm", Gen: 1})
	if err != nil {
		return err
	}
	defer client.Close()
	a, err := shm.OpenWorker(client.ArenaPath())
	if err != nil {
		return err
	}
	defer a.Close()
	for slot := range a.Geometry().Slots {
		clear(a.Payload(slot))
	}
	return nil
}
