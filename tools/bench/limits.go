package main

import (
	"fmt"
)

// runLimitsBench measures the frontend limits' cost on its own cluster.
func runLimitsBench() error {
	fmt.Printf("## Frontend limits (small preset, 2 nodes × 1 worker; real processes)\n\n")
	cluster, err := startBenchCluster(256)
	if err != nil {
		return err
	}
	defer cluster.close()
	return limitsCost(cluster)
}

// limitsCost measures what the frontend's limits (connection cap, body,
// header and idle timeouts, stream limits, the prompt size check) cost:
// streamed tokens/s through a frontend with the defaults and one with
// --no-limits, in the same run, rounds alternating.
func limitsCost(c *benchCluster) error {
	on, err := c.frontend()
	if err != nil {
		return err
	}
	off, err := c.frontend("--no-limits")
	if err != nil {
		return err
	}
	const rounds, streams, tokens = 5, 8, 64
	var tpsOn, tpsOff []float64
	for r := 0; r < rounds; r++ {
		for _, f := range []struct {
			url string
			tps *[]float64
		}{{on, &tpsOn}, {off, &tpsOff}} {
			tps, _, err := streamLoad(f.url, streams, tokens, r)
			if err != nil {
				return err
			}
			*f.tps = append(*f.tps, tps)
		}
	}
	sortFloats(tpsOn)
	sortFloats(tpsOff)
	mOn, mOff := tpsOn[len(tpsOn)/2], tpsOff[len(tpsOff)/2]
	fmt.Printf("| frontend limits (%d rounds of %d concurrent %d-token streams) | tokens/s (median round) |\n|---|---|\n", rounds, streams, tokens)
	fmt.Printf("| with the limits (default) | %.0f |\n", mOn)
	fmt.Printf("| without (`--no-limits`) | %.0f |\n", mOff)
	fmt.Printf("| ratio (goal ≥ 0.98) | %.3f |\n\n", mOn/mOff)
	return nil
}
