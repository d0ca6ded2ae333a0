package localcluster

import (
	"net"
	"strings"
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
	old := l.Addr().String()
	n := &Node{Options: agent.Options{NodeID: "n1", Metrics: old}}
	moved, err := n.FreeMetricsPort()
	now := n.Options.Metrics
	if err != nil || now == old || !strings.Contains(moved, old) || !strings.Contains(moved, now) ||
		!strings.Contains(moved, syscall.EADDRINUSE.Error()) {
		t.Fatalf("a taken port: moved %q (now %q), err %v", moved, now, err)
	}
	if l2, err := net.Listen("tcp", now); err != nil {
		t.Fatalf("the new address %s cannot be bound: %v", now, err)
	} else {
		l2.Close()
	}
	if moved, err := n.FreeMetricsPort(); moved != "" || err != nil || n.Options.Metrics != now {
		t.Fatalf("a free port: moved %q, err %v, now %q", moved, err, n.Options.Metrics)
	}
	n.Options.Metrics = "10.200.0.2:9100"
	if moved, err := n.FreeMetricsPort(); moved != "" || err != nil || n.Options.Metrics != "10.200.0.2:9100" {
		t.Fatalf("an address in a namespace: moved %q, err %v, now %q", moved, err, n.Options.Metrics)
	}
}
