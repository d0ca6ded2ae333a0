package agent

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// ErrNoGPU matches every reason the GPU checker cannot run (no library, no
// device, none built into the binary). The agent then runs without GPU
// checks and says so.
var ErrNoGPU = errors.New("agent: GPU health checks not supported")

// GPUEvent is one critical GPU event.
type GPUEvent struct {
	Device int
	Kind   string // "xid" or "ecc_dbe"
	XID    uint64
}

// A GPUWatcher watches a node's GPUs for critical errors: XIDs a GPU (not
// an application) causes and double-bit ECC errors. The NVML one is
// package agent/nvmlgpu, which the lifeline binary links: its cgo stays
// out of every other program and test that links this package.
type GPUWatcher interface {
	// Run delivers critical events until ctx is done.
	Run(ctx context.Context, out func(GPUEvent))
	// Devices is how many devices it watches.
	Devices() int
	// Close releases the library; Run has returned.
	Close()
}

// startGPU watches the node's GPUs for critical errors, when it has any;
// without, the agent runs without GPU checks and says why.
func (a *Agent) startGPU(ctx context.Context) {
	if a.opts.GPU == nil {
		a.gpuErr = fmt.Errorf("%w: this binary has no GPU watcher (Options.GPU)", ErrNoGPU)
	} else {
		a.gpu, a.gpuErr = a.opts.GPU()
	}
	if a.gpuErr != nil {
		a.gpu = nil
		a.log.Info("GPU health checks off", "reason", a.gpuErr)
		return
	}
	a.track(func() {
		a.gpu.Run(ctx, a.onGPUEvent)
		a.gpu.Close()
	})
}

// onGPUEvent marks the instances on the faulted device not ready — those
// pinned to it and every unpinned one — until the agent restarts.
func (a *Agent) onGPUEvent(e GPUEvent) {
	a.mu.Lock()
	if a.gpuFaults == nil {
		a.gpuFaults = map[int]bool{}
	}
	a.gpuFaults[e.Device] = true
	for _, inst := range a.instances {
		if inst.spec.onFaultedGPU(a.gpuFaults) {
			inst.ready, inst.notReady = false, controlapi.ReasonGPUXid
		}
	}
	a.mu.Unlock()
	a.emit(controlapi.Event{Kind: controlapi.EventNotReady, Reason: controlapi.ReasonGPUXid, Detail: fmt.Sprintf("device %d: %s %d", e.Device, e.Kind, e.XID)})
	a.log.Error("critical GPU error", "failure_reason", controlapi.ReasonGPUXid, "device", e.Device, "kind", e.Kind, "xid", e.XID, "recovery_action", "not ready")
	a.registerAll(context.Background())
}

// onFaultedGPU says whether the instance may compute on a device of
// faults: the one it is pinned to, or any when unpinned.
func (in InstanceSpec) onFaultedGPU(faults map[int]bool) bool {
	if in.GPU != nil {
		return faults[*in.GPU]
	}
	return len(faults) > 0
}

// gpuEnv is what pins a worker to its instance's device: nothing when
// unpinned.
func (in InstanceSpec) gpuEnv() []string {
	if in.GPU == nil {
		return nil
	}
	return []string{"CUDA_DEVICE_ORDER=PCI_BUS_ID", fmt.Sprintf("CUDA_VISIBLE_DEVICES=%d", *in.GPU)}
}

// workerEnv is the environment of an instance's worker processes: the
// agent's, its thread bound and its device.
func (in InstanceSpec) workerEnv() []string {
	env := in.gpuEnv()
	if in.Threads > 0 {
		env = append(env, fmt.Sprintf("GOMAXPROCS=%d", in.Threads))
	}
	if env == nil {
		return nil // the agent's own
	}
	return append(os.Environ(), env...)
}
