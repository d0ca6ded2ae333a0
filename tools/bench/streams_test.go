package main

import (
	"os"
	"testing"
)

// TestStreamsBench runs the frontend-at-scale bench (LIFELINE_BENCH_STREAMS=1):
// a cluster of real processes and a thousand streams, too heavy for the
// ordinary test run.
func TestStreamsBench(t *testing.T) {
	if os.Getenv("LIFELINE_BENCH_STREAMS") != "1" {
		t.Skip("set LIFELINE_BENCH_STREAMS=1 to run the frontend-at-scale bench")
	}
	if err := runStreamsBench(); err != nil {
		t.Fatal(err)
	}
}
