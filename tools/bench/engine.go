package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/lifeline-llm/lifeline/decode/matmul"
	"github.com/lifeline-llm/lifeline/decode/model"
)

// engineModel is one column of the engine table.
type engineModel struct {
	name string
	m    *model.Model
}

// engineFigures are one model's measures; ratios pair measures taken back
// to back, so that a busy machine slows both.
type engineFigures struct {
	b1, b16, prefill float64 // tokens/s
	weightMB         float64 // bytes a batch-1 step streams, in MB
	decodeGBs        float64 // weight bytes per second at batch 1
	streamGBs        float64 // read-only stream over as many bytes
	streamRatio      float64 // median over pairs of decode ÷ stream
	batchRatio       float64 // median over pairs of batch 16 ÷ batch 1
	// Where batch 1's share of the stream goes, each ÷ the stream of the
	// same round: the batch-1 kernel alone (one product over as many
	// bytes), then a step's products alone (every weight matrix in a
	// step's order, each its own parallel call, nothing between them).
	kernelRatio, chainRatio float64
}

// engineRounds is how many back-to-back pairs each ratio is the median of.
const engineRounds = 5

func run(tokens int, minRatio, minStream float64) error {
	fmt.Printf("# Lifeline reference engine benchmark\n\n")
	fmt.Printf("GOMAXPROCS=%d, kernel %s, numerics id `%s`\n\n", runtime.GOMAXPROCS(0), matmul.KernelName(), model.NumericsID())
	models, cleanup, err := engineModels()
	if err != nil {
		return err
	}
	defer cleanup()
	figs := make([]engineFigures, len(models))
	for i, em := range models {
		if figs[i], err = measureEngine(em.m, tokens); err != nil {
			return fmt.Errorf("%s: %w", em.name, err)
		}
	}
	printEngineTable(models, figs)
	g1, g16 := kernelGFLOPs(1), kernelGFLOPs(16)
	fmt.Printf("\n| kernel (1024×384 weights) | figure |\n|---|---|\n")
	fmt.Printf("| matmul GFLOP/s, 1 token | %.1f |\n| matmul GFLOP/s, 16 tokens | %.1f |\n", g1, g16)
	fmt.Printf("| memcpy GB/s (64 MiB) | %.1f |\n", memcpyGBs())
	var failed []string
	// tiny's megabyte of weights sits in cache: its step is bound by the
	// work between products, so the bandwidth target is small's and the
	// checkpoint's.
	for i, em := range models[1:] {
		f := figs[i+1]
		verdict := "met"
		if f.streamRatio < minStream {
			verdict = "NOT MET"
			failed = append(failed, fmt.Sprintf("%s streams its weights at %.0f%% of the read stream", em.name, 100*f.streamRatio))
		}
		fmt.Printf("\nbandwidth target (%s, batch-1 decode ≥ %.0f%% of a read-only stream): %.0f%% — %s", em.name, 100*minStream, 100*f.streamRatio, verdict)
	}
	small := figs[1].batchRatio
	verdict := "met"
	if small < minRatio {
		verdict = "NOT MET"
		failed = append(failed, fmt.Sprintf("batch-16/batch-1 on small is %.1f×, below %.0f×", small, minRatio))
	}
	fmt.Printf("\nbatching target (small, batch-16 ≥ %.0f× batch-1): %.1f× — %s\n\n", minRatio, small, verdict)
	if err := runKVBench(); err != nil {
		return err
	}
	for _, f := range failed {
		fmt.Fprintln(os.Stderr, "bench: target not met:", f)
	}
	return nil
}

// engineModels are tiny, small and a llama2.c checkpoint of stories15M's
// shape (32,000-token vocabulary, unshared classifier), loaded the way a
// worker loads it: mapped.
func engineModels() ([]engineModel, func(), error) {
	var out []engineModel
	for _, p := range []string{"tiny", "small"} {
		m, err := model.Synthetic(p, 1)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, engineModel{p, m})
	}
	dir, err := os.MkdirTemp("", "lifeline-bench-engine-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	path, _, err := writeStories15MShape(dir)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	m, err := model.LoadLlama2C(path)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return append(out, engineModel{"llama2.c 15M, 32k vocab", m}), cleanup, nil
}

// streamedBytes is what one batch-1 decode step reads: every weight but
// the embedding table, of which it reads one row (a shared classifier is
// the embedding table, read whole once).
func streamedBytes(c model.Config) int {
	return (c.Params() - c.VocabSize*c.Dim) * 4
}

func measureEngine(m *model.Model, tokens int) (engineFigures, error) {
	var f engineFigures
	c := m.Config
	tokens = min(tokens, c.ContextLen-16)
	f.weightMB = float64(streamedBytes(c)) / 1e6
	buf := make([]float32, streamedBytes(c)/4)
	for i := range buf {
		buf[i] = float32(i % 251)
	}
	var b1s, b16s, streams, sratios, bratios, kratios, cratios []float64
	for range engineRounds {
		b1, err := decodeThroughput(m, 1, tokens)
		if err != nil {
			return f, err
		}
		st := streamGBs(buf)
		b16, err := decodeThroughput(m, 16, tokens)
		if err != nil {
			return f, err
		}
		b1s, b16s, streams = append(b1s, b1), append(b16s, b16), append(streams, st)
		sratios = append(sratios, b1*f.weightMB/1e3/st)
		bratios = append(bratios, b16/b1)
		kratios = append(kratios, kernelGBs(buf, c.Dim)/st)
		cratios = append(cratios, productsGBs(m)/st)
	}
	// LIFELINE_BENCH_ENGINE_CPUPROFILE=prefix: CPU profiles of a second
	// of batch-1 and of batch-16 decodes, into
	// prefix-d<dim>-v<vocabulary>-b<batch>.pb.gz.
	if prefix := os.Getenv("LIFELINE_BENCH_ENGINE_CPUPROFILE"); prefix != "" {
		for _, batch := range []int{1, 16} {
			stop := startCPUProfile(fmt.Sprintf("%s-d%d-v%d-b%d.pb.gz", prefix, c.Dim, c.VocabSize, batch))
			for start := time.Now(); time.Since(start) < time.Second; {
				if _, err := decodeThroughput(m, batch, tokens); err != nil {
					stop()
					return f, err
				}
			}
			stop()
		}
	}
	f.b1, f.b16, f.streamGBs = median(b1s), median(b16s), median(streams)
	f.decodeGBs = f.b1 * f.weightMB / 1e3
	f.streamRatio, f.batchRatio = median(sratios), median(bratios)
	f.kernelRatio, f.chainRatio = median(kratios), median(cratios)
	n := min(prefillLen, c.ContextLen-1)
	var err error
	f.prefill, err = median3(func() (float64, error) { return prefillThroughput(m, n) })
	return f, err
}

// streamGBs reads buf with matmul.Stream for a while: the read bandwidth
// the batch-1 decode is measured against.
func streamGBs(buf []float32) float64 {
	return rate(len(buf)*4, func() { matmul.Stream(buf) })
}

// rate runs f for a while and returns bytes per call over the time per
// call, in GB/s.
func rate(bytes int, f func()) float64 {
	f()
	iters := 0
	start := time.Now()
	for time.Since(start) < 200*time.Millisecond {
		f()
		iters++
	}
	return float64(bytes*iters) / time.Since(start).Seconds() / 1e9
}

// kernelGBs is the batch-1 product alone: buf as one matrix of rows of
// dim, times one activation vector, in one parallel call.
func kernelGBs(buf []float32, dim int) float64 {
	rows := len(buf) / dim
	x, out := make([]float32, dim), make([]float32, rows)
	return rate(rows*dim*4, func() { matmul.MatMul(out, x, 1, buf[:rows*dim], rows, dim) })
}

// productsGBs is a batch-1 step's products alone: each layer's as the
// engine groups them (Q/K/V in one call, Wo, W1/W3 in one call, W2), then
// the classifier, with nothing between them.
func productsGBs(m *model.Model) float64 {
	c := m.Config
	kv, h := c.KVDim(), c.HiddenDim
	x, xh := make([]float32, max(c.Dim, h)), make([]float32, h)
	q, k, v, o := make([]float32, c.Dim), make([]float32, kv), make([]float32, kv), make([]float32, c.Dim)
	h1, h3, logits := make([]float32, h), make([]float32, h), make([]float32, c.VocabSize)
	return rate(streamedBytes(c)-(c.Layers*2+1)*c.Dim*4, func() {
		for i := range m.W.Layers {
			l := &m.W.Layers[i]
			matmul.MatMuls(x[:c.Dim], 1, c.Dim,
				matmul.Product{Out: q, W: l.Wq, M: c.Dim},
				matmul.Product{Out: k, W: l.Wk, M: kv},
				matmul.Product{Out: v, W: l.Wv, M: kv})
			matmul.MatMul(o, x[:c.Dim], 1, l.Wo, c.Dim, c.Dim)
			matmul.MatMuls(x[:c.Dim], 1, c.Dim,
				matmul.Product{Out: h1, W: l.W1, M: h},
				matmul.Product{Out: h3, W: l.W3, M: h})
			matmul.MatMul(o, xh, 1, l.W2, c.Dim, h)
		}
		matmul.MatMul(logits, x[:c.Dim], 1, m.W.Classifier, c.VocabSize, c.Dim)
	})
}

// median is v's median (0 for none).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func printEngineTable(models []engineModel, figs []engineFigures) {
	fmt.Printf("| measure |")
	for _, em := range models {
		fmt.Printf(" %s |", em.name)
	}
	fmt.Printf("\n|---|")
	for range models {
		fmt.Printf("---|")
	}
	fmt.Println()
	row := func(name string, cell func(f engineFigures) string) {
		fmt.Printf("| %s |", name)
		for _, f := range figs {
			fmt.Printf(" %s |", cell(f))
		}
		fmt.Println()
	}
	row("decode tokens/s, batch 1", func(f engineFigures) string { return fmt.Sprintf("%.0f", f.b1) })
	row("decode tokens/s, batch 16", func(f engineFigures) string { return fmt.Sprintf("%.0f", f.b16) })
	row("batch-16 / batch-1 throughput", func(f engineFigures) string { return fmt.Sprintf("%.1f×", f.batchRatio) })
	row(fmt.Sprintf("prefill tokens/s (%d-token prompt, or the context less one)", prefillLen), func(f engineFigures) string { return fmt.Sprintf("%.0f", f.prefill) })
	row("weights read per batch-1 step, MB", func(f engineFigures) string { return fmt.Sprintf("%.1f", f.weightMB) })
	row("batch 1: weight bytes read per second, GB/s", func(f engineFigures) string { return fmt.Sprintf("%.1f", f.decodeGBs) })
	row("read-only stream over as many bytes (same run), GB/s", func(f engineFigures) string { return fmt.Sprintf("%.1f", f.streamGBs) })
	row("batch-1 decode ÷ read stream", func(f engineFigures) string { return fmt.Sprintf("%.0f%%", 100*f.streamRatio) })
	row("of which: batch-1 kernel alone (one product over as many bytes) ÷ read stream", func(f engineFigures) string { return fmt.Sprintf("%.0f%%", 100*f.kernelRatio) })
	row("of which: a step's products alone (each its own parallel call, nothing between) ÷ read stream", func(f engineFigures) string { return fmt.Sprintf("%.0f%%", 100*f.chainRatio) })
}
