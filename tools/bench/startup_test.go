package main

import (
	"os"
	"testing"
)

// TestStartupBench runs the start-up bench (runStartupBench) when
// LIFELINE_BENCH_STARTUP=1: go test -run StartupBench -v ./tools/bench/.
func TestStartupBench(t *testing.T) {
	if os.Getenv("LIFELINE_BENCH_STARTUP") != "1" {
		t.Skip("a benchmark: set LIFELINE_BENCH_STARTUP=1 to run it")
	}
	if err := runStartupBench(); err != nil {
		t.Fatal(err)
	}
}
