package agent

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// TestGPUFaultNarrowsToPinnedInstances: a critical error on device 1
// marks not ready the instance pinned to device 1 and the unpinned one,
// and leaves the instance pinned to device 0 serving; a pinned worker
// sees only its device (in nvidia-smi's order), an unpinned one every
// device. NVML cannot run here: the event is the one the checker would
// deliver.
func TestGPUFaultNarrowsToPinnedInstances(t *testing.T) {
	zero, one := 0, 1
	a := &Agent{events: newEventLog(), log: slog.New(slog.DiscardHandler), instances: map[string]*instance{
		"on0":      {id: "on0", spec: InstanceSpec{Engine: "llamacpp", Model: "/m/qwen.gguf", GPU: &zero}, ready: true},
		"on1":      {id: "on1", spec: InstanceSpec{Engine: "llamacpp", Model: "/m/qwen.gguf", GPU: &one}, ready: true},
		"unpinned": {id: "unpinned", spec: InstanceSpec{Engine: "llamacpp"}, ready: true},
	}}
	a.onGPUEvent(GPUEvent{Device: 1, Kind: "xid", XID: 79})
	for id, want := range map[string]bool{"on0": true, "on1": false, "unpinned": false} {
		inst := a.instances[id]
		if inst.ready != want || (!want && inst.notReady != controlapi.ReasonGPUXid) {
			t.Errorf("%s: ready %v (%q), want ready %v", id, inst.ready, inst.notReady, want)
		}
		// The canary's verdict on the next pass: an instance on a
		// faulted device stays not ready.
		if faulted := inst.spec.onFaultedGPU(a.gpuFaults); faulted == want {
			t.Errorf("%s: on a faulted device %v", id, faulted)
		}
	}
	env := a.instances["on1"].spec.workerEnv()
	if !slices.Contains(env, "CUDA_VISIBLE_DEVICES=1") || !slices.Contains(env, "CUDA_DEVICE_ORDER=PCI_BUS_ID") {
		t.Errorf("a worker pinned to device 1 runs with %v", env[max(0, len(env)-3):])
	}
	if env := a.instances["unpinned"].spec.workerEnv(); env != nil {
		t.Errorf("an unpinned worker's environment is changed: %v", env)
	}
	// One model on two devices: two instances, told apart by their ids.
	if id0, id1 := instanceID("n1", a.instances["on0"].spec, 0), instanceID("n1", a.instances["on1"].spec, 0); id0 == id1 {
		t.Errorf("instances on devices 0 and 1 share the id %s", id0)
	}
}

// TestGPUFieldIsLlamaCpps: gpu pins a llama.cpp instance; on the
// reference engine, or out of range, it is refused by name.
func TestGPUFieldIsLlamaCpps(t *testing.T) {
	bad := 64
	for _, c := range []struct {
		spec InstanceSpec
		want string
	}{
		{InstanceSpec{Role: "decode", Preset: "tiny", Count: 1, GPU: &bad}, "instances[0].gpu: pins a GPU for engine"},
		{InstanceSpec{Role: "decode", Engine: "llamacpp", Model: "/m.gguf", Count: 1, GPU: &bad}, "instances[0].gpu"},
	} {
		o := Options{NodeID: "n1", Instances: []InstanceSpec{c.spec}}
		err := o.validateInstances(func(field, format string, args ...any) error {
			return fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...))
		})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.spec, err, c.want)
		}
	}
}

// TestStepIntervalIsTheReferenceEngines: step_interval paces the
// reference engine; out of range, beside a synthetic rate or on llama.cpp
// it is refused by name.
func TestStepIntervalIsTheReferenceEngines(t *testing.T) {
	for _, c := range []struct {
		spec InstanceSpec
		want string
	}{
		{InstanceSpec{Role: "decode", Preset: "tiny", Count: 1, StepInterval: Duration(-time.Millisecond)}, "instances[0].step_interval: -1ms"},
		{InstanceSpec{Role: "decode", Preset: "tiny", Count: 1, StepInterval: Duration(2 * time.Second)}, "instances[0].step_interval: 2s (0: off, up to 1s)"},
		{InstanceSpec{Role: "decode", Preset: "tiny", Count: 1, SyntheticRate: 20, StepInterval: Duration(time.Millisecond)}, "synthetic_tokens_per_second"},
		{InstanceSpec{Role: "decode", Engine: "llamacpp", Model: "/m.gguf", Count: 1, StepInterval: Duration(time.Millisecond)}, "step_interval settings are the reference engine's"},
	} {
		o := Options{NodeID: "n1", Instances: []InstanceSpec{c.spec}}
		err := o.validateInstances(func(field, format string, args ...any) error {
			return fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...))
		})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.spec, err, c.want)
		}
	}
	o := Options{NodeID: "n1", Instances: []InstanceSpec{{Role: "decode", Preset: "tiny", Count: 1, StepInterval: Duration(20 * time.Millisecond)}}}
	if err := o.validateInstances(func(field, format string, args ...any) error { return fmt.Errorf(field+": "+format, args...) }); err != nil {
		t.Fatalf("a 20ms step interval on tiny refused: %v", err)
	}
}
