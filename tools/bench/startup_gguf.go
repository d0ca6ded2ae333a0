package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
)

// ggufStartupShape is a llama of 262 M parameters: 525 MB as F16.
var ggufStartupShape = llamacpptest.ShapeOf("llama", 1024, 20, 16, 4, 2816, 4096, gguf.F16)

// runGGUFStartupBench times the reference engine's start on a 500 MB F16
// GGUF (mapped in place, hashed and checked for finite values, its
// vocabulary read) against one read of the file, page cache warm.
func runGGUFStartupBench() error {
	dir, err := os.MkdirTemp("", "lifeline-startup-gguf-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path, err := llamacpptest.Write(dir, ggufStartupShape, 1)
	if err != nil {
		return err
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	buf := make([]byte, st.Size())
	if _, err := readInto(path, buf); err != nil { // warm the page cache
		return err
	}
	cache := filepath.Join(dir, "revisions")
	start := func(revisions string) (time.Duration, error) {
		debug.FreeOSMemory()
		t0 := time.Now()
		e, err := decode.NewEngine(decode.Options{ModelPath: path, RevisionCache: revisions})
		if err != nil {
			return 0, err
		}
		d := time.Since(t0)
		e.Close()
		return d, nil
	}
	if _, err := start(cache); err != nil { // records the revision
		return err
	}
	var reads, readies, restarts []time.Duration
	for range 5 {
		r, err := readInto(path, buf)
		if err != nil {
			return err
		}
		first, err := start("")
		if err != nil {
			return err
		}
		again, err := start(cache)
		if err != nil {
			return err
		}
		reads, readies, restarts = append(reads, r), append(readies, first), append(restarts, again)
	}
	med := func(v []time.Duration) time.Duration { slices.Sort(v); return v[len(v)/2] }
	read, ready, restart := med(reads), med(readies), med(restarts)
	fmt.Printf("# Start-up of a %.0f MB F16 GGUF on the reference engine (page cache warm, median of 5)\n\n", float64(st.Size())/1e6)
	fmt.Printf("| measure | figure | baseline (same run) | ratio |\n|---|---|---|---|\n")
	fmt.Printf("| ready to prefill, first start (decode.NewEngine: mapped, hashed and checked, vocabulary, scheduler) | %.1f ms | read once: %.1f ms | **%.2f×** |\n",
		ms(ready), ms(read), float64(ready)/float64(read))
	fmt.Printf("| ready to prefill, restart (revision cache: the hash pass runs after ready) | %.1f ms | read once: %.1f ms | **%.2f×** |\n\n",
		ms(restart), ms(read), float64(restart)/float64(read))
	return nil
}
