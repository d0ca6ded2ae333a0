package agent

import (
	"os"
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

// TestCollectorReadsWorkers: at a scrape the agent reads each worker's
// process from /proc (this test's own process stands in for a worker) and
// exports it with the load the worker last reported against its capacity,
// beside the agent's own Go runtime and process series; an instance with
// no process exports its load only.
func TestCollectorReadsWorkers(t *testing.T) {
	a := &Agent{metrics: newMetrics(), instances: map[string]*instance{
		"n1-decode-small-0": {id: "n1-decode-small-0", pid: os.Getpid(), running: 2, queued: 5, capacity: 8},
		"n1-decode-small-1": {id: "n1-decode-small-1"},
	}}
	a.metrics.reg.MustRegister(newCollector(a))
	fams, err := a.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			key := f.GetName()
			for _, l := range mt.GetLabel() {
				key += "/" + l.GetValue()
			}
			got[key] = mt.GetGauge().GetValue() + mt.GetCounter().GetValue()
		}
	}
	const w = "/n1-decode-small-0"
	for name, ok := range map[string]bool{
		"lifeline_agent_worker_resident_memory_bytes" + w: got["lifeline_agent_worker_resident_memory_bytes"+w] > 1<<20,
		"lifeline_agent_worker_open_fds" + w:              got["lifeline_agent_worker_open_fds"+w] >= 3,
		"lifeline_agent_worker_threads" + w:               got["lifeline_agent_worker_threads"+w] >= 1,
		"lifeline_agent_worker_cpu_seconds_total" + w:     got["lifeline_agent_worker_cpu_seconds_total"+w] > 0,
		"lifeline_agent_worker_running_requests" + w:      got["lifeline_agent_worker_running_requests"+w] == 2,
		"lifeline_agent_worker_queued_requests" + w:       got["lifeline_agent_worker_queued_requests"+w] == 5,
		"lifeline_agent_worker_capacity_requests" + w:     got["lifeline_agent_worker_capacity_requests"+w] == 8,
		"go_goroutines":                 got["go_goroutines"] > 0,
		"process_resident_memory_bytes": got["process_resident_memory_bytes"] > 0,
	} {
		if !ok {
			t.Errorf("%s = %v", name, got[name])
		}
	}
	if _, ok := got["lifeline_agent_worker_resident_memory_bytes/n1-decode-small-1"]; ok {
		t.Error("an instance without a process exports process series")
	}
}
