package agent

import (
	"testing"

	"github.com/lifeline-llm/lifeline/decode/wire"
)

// TestWorkerHealthMetrics: a worker's detachable-request counters, as its
// health reply gives them, are exported per instance.
func TestWorkerHealthMetrics(t *testing.T) {
	m := newMetrics()
	m.workerHealth("n1-decode-small-0", &wire.HealthReply{FramesBuffered: 7, FramesDropped: 2, Detached: 1, Attaches: 3})
	m.workerHealth("n1-decode-small-1", &wire.HealthReply{Attaches: 1})
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "instance_id" && l.GetValue() == "n1-decode-small-0" {
					got[f.GetName()] = mt.GetGauge().GetValue()
				}
			}
		}
	}
	for name, want := range map[string]float64{
		"lifeline_agent_worker_frames_buffered": 7, "lifeline_agent_worker_frames_dropped": 2,
		"lifeline_agent_worker_detached_requests": 1, "lifeline_agent_worker_attaches": 3,
	} {
		if got[name] != want {
			t.Errorf("%s: %v, want %v (all: %v)", name, got[name], want, got)
		}
	}
}
