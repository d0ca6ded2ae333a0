package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// TestDeathWritesFailLoudly: when etcd cannot take a death's
// deregistration or failure announcement, the agent logs it with the
// death's correlation fields and counts it, and the next refresh deletes
// the registration again.
func TestDeathWritesFailLoudly(t *testing.T) {
	a, cli := testAgent(t)
	var logs bytes.Buffer
	a.log = slog.New(slog.NewJSONHandler(&logs, nil))
	// A client whose every request fails: no etcd listens on port 1.
	dead, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	a.etcd = dead
	a.lease = grant(t, cli)
	key := schema.InstancesPrefix + "n1-decode-tiny-0"
	a.reg.lease, a.reg.written = a.lease, map[string]written{key: {val: "{}"}}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	a.deregister(ctx, "n1-decode-tiny-0", 7, "signal")
	a.announceFailure(ctx, schema.Failure{InstanceID: "n1-decode-tiny-0", Generation: 7, Reason: "signal"})

	for _, op := range []string{opDeregister, opAnnounceFailure} {
		if n := writeErrors(t, a, op); n != 1 {
			t.Errorf("lifeline_agent_etcd_write_errors_total{op=%q} = %v, want 1", op, n)
		}
	}
	if n := writeErrors(t, a, opRegister); n != 0 {
		t.Errorf("register errors %v, want 0", n)
	}
	var seen []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["instance_id"] != "n1-decode-tiny-0" || rec["generation"] != float64(7) || rec["failure_reason"] != "signal" || rec["err"] == nil {
			t.Errorf("log line without the death's correlation fields: %s", line)
		}
		seen = append(seen, rec["op"].(string))
	}
	if len(seen) != 2 || seen[0] != opDeregister || seen[1] != opAnnounceFailure {
		t.Errorf("logged ops %v, want deregister then announce_failure", seen)
	}
	if _, ok := a.reg.written[key]; ok {
		t.Errorf("a failed deregistration left %s remembered: the next refresh would not delete it", key)
	}
}

// writeErrors reads lifeline_agent_etcd_write_errors_total{op} from the
// agent's registry, as /metrics would show it.
func writeErrors(t *testing.T, a *Agent, op string) float64 {
	t.Helper()
	mfs, err := a.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lifeline_agent_etcd_write_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == op {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no lifeline_agent_etcd_write_errors_total{op=%q} in the registry", op)
	return 0
}
