package localcluster

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/lifeline-llm/lifeline/agent"
)

// TestFreeMetricsPort: a node whose loopback metrics port another process
// bound moves to a free one (and says what found it taken); a free port
// and an address in a network namespace are kept.
func TestFreeMetricsPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	n := &Node{Options: agent.Options{NodeID: "n1", Metrics: l.Addr().String()}}
	moved, taken, err := n.FreeMetricsPort()
	if err != nil || moved == "" || moved != n.Options.Metrics || !errors.Is(taken, syscall.EADDRINUSE) {
		t.Fatalf("a taken port: moved %q (now %q), taken %v, err %v", moved, n.Options.Metrics, taken, err)
	}
	if l2, err := net.Listen("tcp", moved); err != nil {
		t.Fatalf("the new address %s cannot be bound: %v", moved, err)
	} else {
		l2.Close()
	}
	free := n.Options.Metrics
	if moved, taken, err := n.FreeMetricsPort(); moved != "" || taken != nil || err != nil || n.Options.Metrics != free {
		t.Fatalf("a free port: moved %q, taken %v, err %v, now %q", moved, taken, err, n.Options.Metrics)
	}
	n.Options.Metrics = "10.200.0.2:9100"
	if moved, taken, err := n.FreeMetricsPort(); moved != "" || taken != nil || err != nil || n.Options.Metrics != "10.200.0.2:9100" {
		t.Fatalf("an address in a namespace: moved %q, taken %v, err %v, now %q", moved, taken, err, n.Options.Metrics)
	}
}
