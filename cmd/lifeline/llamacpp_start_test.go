//go:build llamacpp

package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestLlamaCppWorkerThatCannotLoadIsAnInstanceError: a GGUF whose header
// is sound but that llama.cpp refuses (a tensor missing) passes the
// configuration check; its worker then says why it cannot start, and
// `nodectl status` shows that as the instance's error, not only a count
// of exits.
func TestLlamaCppWorkerThatCannotLoadIsAnInstanceError(t *testing.T) {
	shape := llamacpptest.TinyQwen2
	shape.Without = "output_norm.weight"
	path := llamacpptest.WriteModel(t, t.TempDir(), shape, 1)
	n := clustertest.NewNode(t, func(c *clustertest.Config) {
		c.Instances = []agent.InstanceSpec{{Role: "decode", Engine: "llamacpp", Model: path, Count: 1, Threads: 1}}
	})
	proctest.WaitFor(t, 30*time.Second, "the instance's start error", func() (bool, string) {
		var st controlapi.Status
		if json.Unmarshal([]byte(n.NodectlTry(t, "status", "--json")), &st) != nil || len(st.Instances) != 1 {
			return false, "no instance yet"
		}
		w := st.Instances[0]
		return strings.Contains(w.StartError, "could not load") && strings.Contains(w.StartError, path) && !w.Ready, w.StartError
	})
	if out := n.Nodectl(t, "workers"); !strings.Contains(out, "cannot start: ") {
		t.Fatalf("nodectl workers does not say why:\n%s", out)
	}
}
