package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestRollingUpgradeUnderLoad: `lifeline upgrade --rolling` of a 3-node
// `lifeline up` while clients stream seeded requests without pause: every
// node is drained, restarted and back at a higher generation, one at a
// time, and not one stream fails or differs from its fault-free run.
func TestRollingUpgradeUnderLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	up := startUp(t, dir, "--nodes", "3")
	const seeds = 6
	bodies := make([]map[string]any, seeds)
	references := make([][]clustertest.Token, seeds)
	for i := range bodies {
		bodies[i] = map[string]any{"model": "tiny", "prompt": fmt.Sprintf("Story %d:", i), "max_tokens": 200, "seed": 100 + i,
			"temperature": 0.9, "stream": true, "ignore_eos": true}
		references[i], _ = clustertest.StreamCompletion(t, up.url, bodies[i], nil)
	}
	before := map[string]controlapi.Status{}
	socks, _ := filepath.Glob(filepath.Join(dir, "node-*", "agent.sock"))
	for _, s := range socks {
		st, err := nodectl.GetStatus(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		before[s] = st
	}

	// Steady load: three clients streaming the seeded requests in turn.
	var done, failed atomic.Int64
	var mu sync.Mutex
	var failures []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := 0; c < 3; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := c; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				i := k % seeds
				got, last, err := clustertest.Stream(up.url, bodies[i], nil)
				if err == nil && !sameTokens(got, references[i]) {
					err = fmt.Errorf("seed %d: %d tokens, differ from the fault-free run (end %v)", 100+i, len(got), last)
				}
				if err != nil {
					failed.Add(1)
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
					continue
				}
				done.Add(1)
			}
		}()
	}
	out, errOut, err := proctest.Run(t, "upgrade", "--rolling", "--data-dir", dir, "--deadline", "10s", "--hard-deadline", "20s")
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("upgrade: %v\n%s\n%s", err, out, errOut)
	}
	t.Logf("upgrade:\n%s", out)
	if failed.Load() != 0 || done.Load() < 6 {
		t.Fatalf("%d streams failed during the upgrade, %d completed identical:\n%s", failed.Load(), done.Load(), strings.Join(failures, "\n"))
	}
	for s, b := range before {
		st, err := nodectl.GetStatus(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		if ok, why := upgradedFrom(b, st); !ok {
			t.Fatalf("node %s after the upgrade: %s", st.NodeID, why)
		}
	}
	t.Logf("%d streams completed identical during the upgrade", done.Load())
}

// upgradedFrom reports whether st is a new agent whose every instance is
// ready at a higher generation than in b.
func upgradedFrom(b, st controlapi.Status) (bool, string) {
	if st.PID == b.PID {
		return false, "the same agent"
	}
	for _, w := range b.Instances {
		found := false
		for _, n := range st.Instances {
			if n.InstanceID == w.InstanceID {
				found = true
				if !n.Ready || n.Generation <= w.Generation {
					return false, fmt.Sprintf("%s at generation %d ready %v (was %d)", w.InstanceID, n.Generation, n.Ready, w.Generation)
				}
			}
		}
		if !found {
			return false, w.InstanceID + " is gone"
		}
	}
	return true, ""
}
