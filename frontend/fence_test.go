package frontend

import (
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/route"
)

// TestFenceByGenerationAndAddress: once an instance registers at a newer
// generation, a frame stamped with the older one ends its stream when the
// stream's connection goes to another address (a replaced process), and
// not when it goes to the address the newest registration names (the same
// process, re-registered after a lost lease, whose frames stamped before
// it learnt its generation are still arriving).
func TestFenceByGenerationAndAddress(t *testing.T) {
	s := &Server{router: route.NewRouter(), addrs: map[string]string{}}
	s.router.Update(route.Instance{ID: "w", Generation: 2, Model: "m", Ready: true})
	s.addrs["w"] = "127.0.0.1:4000"
	old := reqfsm.Endpoint{InstanceID: "w", Generation: 1}
	cases := []struct {
		addr  string
		gen   uint64
		fence bool
	}{
		{"127.0.0.1:4000", 1, false}, // same process, frame stamped before it learnt generation 2
		{"127.0.0.1:4000", 2, false},
		{"127.0.0.1:5000", 1, true}, // another process: replaced
		{"127.0.0.1:5000", 2, false},
		{"", 1, true},
	}
	for _, c := range cases {
		err := s.fenced(old, c.addr, &wire.Frame{InstanceId: "w", Generation: c.gen})
		if (err != nil) != c.fence || (err != nil && !strings.Contains(err.Error(), "registered at 2")) {
			t.Errorf("frame at generation %d on a connection to %q: %v, want fenced %v", c.gen, c.addr, err, c.fence)
		}
	}
}
