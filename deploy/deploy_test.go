// Package deploy holds the systemd unit and example configuration; its
// test keeps them in line with what the agent accepts.
package deploy

import (
	"os"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/agent"
)

func TestExampleConfigValidates(t *testing.T) {
	var o agent.Options
	if err := agent.LoadFile("agent.example.json", &o); err != nil {
		t.Fatal(err)
	}
	o.Socket = "/run/lifeline/agent.sock"
	o.Defaults()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestUnitKeepsWorkersAcrossRestarts(t *testing.T) {
	b, err := os.ReadFile("lifeline-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "KillMode=process", "TimeoutStopSec=", "--check-config"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("unit lacks %q", want)
		}
	}
}
