//go:build llamacpp

package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
)

// goEngineFigures are the reference engine's throughputs on a GGUF
// against a plain llama.cpp loop on the same file (batch 1, batch 16,
// prefill), medians of back-to-back pairs.
type goEngineFigures struct {
	plain, goEng, ratio [3]float64
	b16OverB1           float64
}

// runGoEngineBench measures the reference engine against llama.cpp on
// generated GGUFs of the small preset's shape, Q8_0 and F16.
func runGoEngineBench() error {
	dir, err := os.MkdirTemp("", "lifeline-bench-goengine")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	names := []string{"Q8_0", "F16"}
	paths := make([]string, len(names))
	for i, t := range []gguf.TensorType{gguf.Q8_0, gguf.F16} {
		shape := llamacpptest.Small
		shape.Weights = t
		sub := filepath.Join(dir, names[i])
		if err := os.Mkdir(sub, 0o755); err != nil {
			return err
		}
		if paths[i], err = llamacpptest.Write(sub, shape, 1); err != nil {
			return err
		}
	}
	return goEngineOn(names, paths)
}

// goEngineOn measures and prints the reference engine against llama.cpp
// on each file.
func goEngineOn(names, paths []string) error {
	fmt.Printf("\n# The reference engine against llama.cpp on the same GGUF\n\n")
	figs := make([]goEngineFigures, len(paths))
	for i, p := range paths {
		var err error
		if figs[i], err = measureGoEngine(p); err != nil {
			return fmt.Errorf("%s on the reference engine: %w", names[i], err)
		}
	}
	printGoEngineTable(names, figs)
	return nil
}

// measureGoEngine runs the reference engine (the file's weights decoded
// tile by tile into its float32 kernels) and llama.cpp on the GGUF at
// path, 2 threads each, in alternation. llama.cpp gets its best
// configuration for each run: one sequence for batch 1 and prefill,
// sixteen for batch 16.
func measureGoEngine(path string) (goEngineFigures, error) {
	var f goEngineFigures
	m, err := llamacpp.LoadModel(path, llamacpp.ModelParams{})
	if err != nil {
		return f, err
	}
	defer m.Close()
	c16, err := m.NewContext(llamacpp.ContextParams{Context: llamaContext, Sequences: llamaLimits.Slots(), Batch: llamaLimits.MaxStepTokens, Threads: 2})
	if err != nil {
		return f, err
	}
	defer c16.Close()
	c1, err := m.NewContext(llamacpp.ContextParams{Context: llamaContext, Sequences: 1, Batch: llamaLimits.MaxStepTokens, Threads: 2})
	if err != nil {
		return f, err
	}
	defer c1.Close()
	e, err := decode.NewEngine(decode.Options{ModelPath: path, Limits: llamaLimits})
	if err != nil {
		return f, err
	}
	defer e.Close()
	fmt.Printf("- %s on the reference engine: numerics `%s`, continuation %s\n", filepath.Base(filepath.Dir(path)), e.NumericsID(), e.Continuation())
	plain, goEng, err := paired(func(batch, prompt, out int) (float64, error) {
		if batch > 1 {
			return plainLoop(c16, m, batch, prompt, out)
		}
		return plainLoop(c1, m, batch, prompt, out)
	}, func(batch, prompt, out int) (float64, error) { return lifelineRun(e, batch, prompt, out) })
	if err != nil {
		return f, err
	}
	var scale []float64
	for k := range benchRuns {
		ratios := make([]float64, len(plain[k]))
		for i := range ratios {
			ratios[i] = goEng[k][i] / plain[k][i]
			if k == 1 {
				scale = append(scale, goEng[1][i]/goEng[0][i])
			}
		}
		f.plain[k], f.goEng[k], f.ratio[k] = median(plain[k]), median(goEng[k]), median(ratios)
	}
	f.b16OverB1 = median(scale)
	return f, nil
}

// printGoEngineTable prints the reference engine against llama.cpp on
// the same files, with the goals of the issue that asked for them.
func printGoEngineTable(names []string, figs []goEngineFigures) {
	fmt.Printf("\n| tokens/s (reference engine ÷ llama.cpp, same file, 2 threads, median of %d pairs) |", llamaPairs)
	for _, n := range names {
		fmt.Printf(" %s |", n)
	}
	fmt.Printf(" goal |\n|---|---|---|---|\n")
	goals := []string{"≥ 0.8", "—", "≥ 0.5"}
	for k, row := range []string{"decode, batch 1", "decode, batch 16", fmt.Sprintf("prefill, %d tokens", llamaPrefill)} {
		fmt.Printf("| %s |", row)
		for _, f := range figs {
			fmt.Printf(" %.0f ÷ %.0f = **%.3f** |", f.goEng[k], f.plain[k], f.ratio[k])
		}
		fmt.Printf(" %s |\n", goals[k])
	}
	fmt.Printf("| reference engine, batch 16 ÷ batch 1 |")
	for _, f := range figs {
		fmt.Printf(" **%.2f×** |", f.b16OverB1)
	}
	fmt.Printf(" ≥ 6× |\n")
}
